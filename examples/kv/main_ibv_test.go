//go:build ibverbs && linux && cgo

package main

import (
	"os"
	"strings"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

// TestRunBothIBV runs the example with -device set to the first RDMA device (or
// MWRPC_IBV_DEVICE): server and client on ibv. Without a device it is skipped, or fails
// with MWRPC_IBV_REQUIRE=1.
func TestRunBothIBV(t *testing.T) {
	d, err := ibv.Open(os.Getenv("MWRPC_IBV_DEVICE"))
	if err != nil {
		if os.Getenv("MWRPC_IBV_REQUIRE") == "1" {
			t.Fatalf("no RDMA device (MWRPC_IBV_REQUIRE=1): %v", err)
		}
		t.Skipf("SKIPPED: no RDMA device to test on (%v); run `make test-rxe` for Soft-RoCE in a VM", err)
	}
	name := d.Name()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	*device = name
	defer func() { *device = "" }()
	var out strings.Builder
	if err := runBoth(&out, "127.0.0.1:0", 200); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"(RDMA device " + name + " (ibv))", "put and got back a 1048576-byte value", "NotFound",
		"1 large responses fetched with RDMA READ", "1 revoked by the client's SEND_WITH_INV"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
