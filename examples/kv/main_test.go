package main

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestRunBoth runs the example as `go run ./examples/kv` does (and, on Linux, as
// `go run ./examples/kv -on shm:///path` does), and checks what it says.
func TestRunBoth(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { testRunBoth(t, "127.0.0.1:0") })
	t.Run("shm", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skipf("SKIPPED: the shm fabric needs Linux, not %s", runtime.GOOS)
		}
		testRunBoth(t, "shm://"+filepath.Join(t.TempDir(), "kv.sock"))
	})
}

func testRunBoth(t *testing.T, addr string) {
	var out strings.Builder
	if err := runBoth(&out, addr, 200); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"put and got back a 1048576-byte value", "NotFound", "1 large responses fetched with RDMA READ", "1 revoked by the client's SEND_WITH_INV"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
