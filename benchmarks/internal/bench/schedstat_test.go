package bench

import (
	"bytes"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseSchedstat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1130942 25360 12\n", 25360, true},
		{"0 0 0", 0, true},
		{"1 2", 0, false},                        // a field missing
		{"1 x 3", 0, false},                      // not a number
		{"1 -5 3", 0, false},                     // negative
		{"", 0, false},                           // empty
		{"1 2 3 4", 0, false},                    // a layout this parser does not know
		{"9 123456789012 7", 123456789012, true}, // two minutes, in ns
	} {
		got, ok := parseSchedstat([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseSchedstat(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestProcessRunQueueWait reads this process's wait where Linux keeps schedstat, and
// reports it unknown elsewhere and for a process that does not exist.
func TestProcessRunQueueWait(t *testing.T) {
	if _, ok := processRunQueueWait(-1); ok {
		t.Error("a wait for pid -1")
	}
	w, ok := processRunQueueWait(os.Getpid())
	if runtime.GOOS != "linux" {
		if ok {
			t.Errorf("a wait (%v) on %s, which has no schedstat", w, runtime.GOOS)
		}
		return
	}
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		t.Skipf("this kernel keeps no schedstat (CONFIG_SCHED_INFO off?): %v", err)
	}
	if !ok || w < 0 {
		t.Fatalf("processRunQueueWait(self) = %v, %v; want a wait", w, ok)
	}
}

// TestStarvedRows: summarize turns the rounds' waits into ms per second, and the report
// names the rows past starvedWait (by the harness's or the server's wait) and no other.
func TestStarvedRows(t *testing.T) {
	// 2 s rounds of 10 calls; cpu and scpu are each process's CPU time over the round.
	round := func(wait, cpu, swait, scpu time.Duration) []Round {
		return []Round{{Ops: 10, Elapsed: 2 * time.Second, CPU: cpu, ServerCPU: scpu, HasServerCPU: true,
			Waited: wait, ServerWaited: swait, HasWaited: true, HasServerWaited: true}}
	}
	ms := time.Millisecond
	// Waits as long as the runs, as two processes on 2 cores have with nothing else: calm.
	calm := summarize("mwrpc-tcp", Cell{64, 1}, round(2600*ms, 1400*ms, 2400*ms, 1200*ms))
	client := summarize("mwrpc-shm", Cell{4096, 16}, round(1600*ms, 40*ms, 10*ms, 40*ms))
	server := summarize("rawtcp", Cell{4096, 16}, round(0, 0, 400*ms, 20*ms))
	// Little wait, if next to nothing run: not starved (below starvedWait).
	idle := summarize("drpc", Cell{64, 1}, round(100*ms, 0, 0, 0))
	if *client.RunQueueMsPerS != 800 || *client.ServerRunQueueMsPerS != 5 {
		t.Errorf("ms/s = %v, %v; want 800 and 5 (1.6 s and 10 ms over 2 s)", *client.RunQueueMsPerS, *client.ServerRunQueueMsPerS)
	}
	unknown := summarize("grpc", Cell{64, 1}, []Round{{Ops: 1, Elapsed: time.Second}})
	if unknown.RunQueueMsPerS != nil || unknown.ServerRunQueueMsPerS != nil {
		t.Error("a wait for rounds that measured none")
	}
	r := Report{Setup: Setup{Sides: "x", Rounds: 1}, Results: []Result{calm, client, server, idle, unknown}}
	var b bytes.Buffer
	if err := r.WriteMarkdown(&b, nil); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{"mwrpc-shm 4 KiB c16 (harness waited 800 ran 20, server waited 5 ran 20)", "rawtcp 4 KiB c16 (harness waited 0 ran 0, server waited 200 ran 10)"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report does not name %q as starved:\n%s", want, md)
		}
	}
	line := md[strings.Index(md, "Starved by the machine"):]
	line = line[:strings.Index(line, "\n")]
	if strings.Contains(line, "mwrpc-tcp") || strings.Contains(line, "drpc") {
		t.Errorf("a calm row named starved: %s", line)
	}
	r.Results = []Result{calm, idle, unknown}
	b.Reset()
	if err := r.WriteMarkdown(&b, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "Starved") {
		t.Errorf("a starved line with no starved row:\n%s", b.String())
	}
}
