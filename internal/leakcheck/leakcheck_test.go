package leakcheck

import "testing"

func TestCreatedBy(t *testing.T) {
	const kitex = "goroutine 66 [chan receive]:\nmain.worker()\n\t/x.go:1 +0x1\n" +
		"created by github.com/cloudwego/kitex/client.(*timeoutPool).createWorker in goroutine 4\n\t/y.go:2 +0x2"
	const own = "goroutine 7 [select]:\ngithub.com/mwrpc/mwrpc/transport.(*poller).run()\n\t/p.go:1 +0x1\n" +
		"created by github.com/mwrpc/mwrpc/transport.newPoller in goroutine 1\n\t/p.go:2 +0x2"
	const first = "goroutine 1 [running]:\nmain.main()\n\t/m.go:1 +0x1"
	ignore := []string{"github.com/cloudwego/", "os/signal."}
	for _, tc := range []struct {
		name  string
		stack string
		want  bool
	}{
		{"a peer's worker", kitex, true},
		{"the project's own goroutine", own, false},
		{"no creator (the main goroutine)", first, false},
		{"a prefix in the stack, not the creator", "goroutine 9 [select]:\ngithub.com/cloudwego/netpoll.wait()\n\t/n.go:1\ncreated by main.run in goroutine 1", false},
	} {
		if got := createdBy(tc.stack, ignore); got != tc.want {
			t.Errorf("%s: createdBy = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCountIgnores(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	all := count(nil)
	go func() { <-stop }()
	if got := count(nil); got != all+1 {
		t.Fatalf("count(nil) = %d after starting one goroutine, want %d", got, all+1)
	}
	// The goroutine above was created by this test's function, so naming it leaves it out.
	if got := count([]string{"github.com/mwrpc/mwrpc/internal/leakcheck.TestCountIgnores"}); got != all {
		t.Fatalf("count ignoring this test's goroutines = %d, want %d", got, all)
	}
}
