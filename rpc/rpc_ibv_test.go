//go:build ibverbs && linux && cgo

package rpc_test

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

// TestIBV runs a representative subset of this package's tests with the server and the
// client each on an RDMA device of their own (ibv.Open: two contexts of one device, in
// loopback; Soft-RoCE in `make test-rxe`). MWRPC_IBV_DEVICE names the device (default: the
// first); without one the test is skipped, or fails with MWRPC_IBV_REQUIRE=1.
func TestIBV(t *testing.T) {
	name := os.Getenv("MWRPC_IBV_DEVICE")
	d, err := ibv.Open(name)
	if err != nil {
		if os.Getenv("MWRPC_IBV_REQUIRE") == "1" {
			t.Fatalf("no RDMA device (MWRPC_IBV_REQUIRE=1): %v", err)
		}
		t.Skipf("SKIPPED: no RDMA device to test on (%v); run `make test-rxe` for Soft-RoCE in a VM", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	open := func(t testing.TB) *ibv.Device {
		d, err := ibv.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Errorf("close %s: %v", d.Name(), err)
			}
		})
		return d
	}
	withDevices = func(t testing.TB) ([]rpc.ServerOption, []rpc.DialOption) {
		return []rpc.ServerOption{rpc.WithDevice(open(t))}, []rpc.DialOption{rpc.WithDevice(open(t))}
	}
	defer func() { withDevices = nil }()
	runFabricSuite(t,
		fabricTest{"Telemetry", TestTelemetry},
		fabricTest{"TelemetryDroppedConnection", TestTelemetryDroppedConnection},
		fabricTest{"TLS", TestTLS},
		fabricTest{"Evolution", TestEvolution},
		fabricTest{"DialWaits", TestDialWaits},
	)
}
