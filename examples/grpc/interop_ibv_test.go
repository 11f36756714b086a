//go:build ibverbs && linux && cgo

package main

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/mwnet"
	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

// TestInteropIBV runs every interop case over mwnet on an RDMA device (Soft-RoCE in `make
// test-rxe`): the listener and the dialer each open the device on their own (two
// ibv_contexts, as two processes would) and connect through it in loopback; the bootstrap
// goes over loopback TCP. MWRPC_IBV_DEVICE names the device (default: the first); without
// one the test is skipped, or fails with MWRPC_IBV_REQUIRE=1.
func TestInteropIBV(t *testing.T) {
	name := os.Getenv("MWRPC_IBV_DEVICE")
	open := func() *ibv.Device {
		d, err := ibv.Open(name)
		if err != nil {
			if os.Getenv("MWRPC_IBV_REQUIRE") == "1" {
				t.Fatalf("no RDMA device (MWRPC_IBV_REQUIRE=1): %v", err)
			}
			t.Skipf("SKIPPED: no RDMA device to test on (%v); run `make test-rxe` for Soft-RoCE in a VM", err)
		}
		t.Cleanup(func() { // after every Conn and the listener on it are closed
			if err := d.Close(); err != nil {
				t.Errorf("close %s: %v", d.Name(), err)
			}
		})
		return d
	}
	server, client := open(), open()
	runInterop(t, "ibv "+server.Name(), "127.0.0.1:0",
		[]mwnet.Option{mwnet.WithDevice(server)}, []mwnet.Option{mwnet.WithDevice(client)})
}
