//go:build ibverbs && linux && cgo

package ibv_test

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

// DeviceEnv names the device the tests open (default: the first one).
const deviceEnv = "MWRPC_IBV_DEVICE"

// requireEnv, when set to 1, turns a missing RDMA device into a failure (make test-rxe).
const requireEnv = "MWRPC_IBV_REQUIRE"

// openOrSkip opens the test device. Without one the test is skipped with a message that
// says so, unless MWRPC_IBV_REQUIRE=1.
func openOrSkip(t testing.TB) *ibv.Device {
	t.Helper()
	d, err := ibv.Open(os.Getenv(deviceEnv))
	if err != nil {
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("no RDMA device (%s=1): %v", requireEnv, err)
		}
		t.Skipf("SKIPPED: no RDMA device to test on (%v); run `make test-rxe` for Soft-RoCE in a VM", err)
	}
	return d
}

// TestOpen opens the device and reports what the provider found.
func TestOpen(t *testing.T) {
	d := openOrSkip(t)
	a := d.Attr()
	t.Logf("device %s (Soft-RoCE %v), GID index %d: %+v", d.Name(), d.SoftRoCE(), d.GIDIndex(), a)
	if a.MaxQPWR <= 0 || a.MaxSGE <= 0 || a.MaxCQE <= 0 || a.MaxInlineData <= 0 {
		t.Errorf("implausible limits %+v", a)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}
