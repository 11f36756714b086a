package rpc_test

import (
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"os"
	"testing"
)

// peerMain, when a test file sets it (rpc_shm_kill_linux_test.go), runs instead of the
// tests if it recognizes this process as a peer that a test started (this binary run
// again); it reports whether it did, and the process then exits.
var peerMain func() bool

func TestMain(m *testing.M) {
	if peerMain != nil && peerMain() {
		os.Exit(0)
	}
	os.Exit(leakcheck.Main(m))
}
