//go:build ibverbs && linux && cgo

package transport

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

// With the build tag ibverbs the end-to-end tests that range over fabrics also run over
// the ibv provider (libibverbs; Soft-RoCE in `make test-rxe`): client and server each open
// the device on their own (two ibv_contexts of one device, as two processes would) and
// connect through it in loopback. Tests that pick fabrics[0] or fabrics[1] (the soft
// provider's statistics, for example) are unaffected: "ibv" is appended last.
//
// MWRPC_IBV_DEVICE names the device (default: the first); without one the fabric is left
// out with a note, and with MWRPC_IBV_REQUIRE=1 (make test-rxe) every test that ranges
// over fabrics fails instead.
func init() {
	name := os.Getenv("MWRPC_IBV_DEVICE")
	d, err := ibv.Open(name)
	if err == nil {
		err = d.Close()
	}
	if err != nil {
		if os.Getenv("MWRPC_IBV_REQUIRE") == "1" {
			fabrics = append(fabrics, fabric{"ibv", func(t testing.TB) (verbs.Device, verbs.Device) {
				t.Fatalf("no RDMA device (MWRPC_IBV_REQUIRE=1): %v", err)
				return nil, nil
			}})
			return
		}
		ibvMissing = err
		return
	}
	fabrics = append(fabrics, fabric{"ibv", func(t testing.TB) (verbs.Device, verbs.Device) {
		t.Helper()
		if why, ok := ibvKnown[t.Name()]; ok && os.Getenv("MWRPC_IBV_KNOWN") != "run" {
			t.Skipf("SKIPPED: %s: known failure on the ibv fabric (MWRPC_IBV_KNOWN=run runs it): %s", t.Name(), why)
		}
		c, err := ibv.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ibv.Open(name)
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
		return c, s
	}})
}

// ibvKnown lists the tests that fail on the ibv fabric for a reason found and written
// down, by test name: they are skipped with that reason (make test-rxe counts them), and
// MWRPC_IBV_KNOWN=run runs them anyway.
var ibvKnown = map[string]string{
	// 1000 concurrent calls, a third of them 100 KiB (READs both ways): on Soft-RoCE
	// (Debian 6.1 kernel) the client's send queue stops for good after a receiver-not-ready
	// NAK while READs are outstanding (hw_counters: send_rnr_err and completer_retry_err
	// rise, then sent_pkts stays put; no error completion, no async event). Calls hang
	// until the server's lease reclaims a window with LOCAL_INV, which rxe fails with
	// LOC_QP_OP_ERR, and teardown then panics with a double pool Release. The RNR itself
	// comes from the transport: Release messages (ctrlSlots) are limited by send
	// completions, which the peer's NIC acknowledges before its poller reposts the slot,
	// so a burst of them can find no receive posted. Small payloads alone (no READs) pass.
	// Since each side posts 4x ctrlSlots extra receives (recvCtrlSlots), the case passed 6
	// of 7 runs in the VM; the remaining failure was a QP error whose cause is not traced
	// yet. It stays here until the receiver acknowledges reposted control slots.
	// The server closes its side of a connection while ten calls wait on their handlers.
	// On the soft fabrics the peer hears of it (the TCP stream ends, or the in-process QP
	// errors); on RDMA the destroyed QP is invisible to an idle peer: the client's QP has
	// nothing in flight, so no retry times out and no completion reports anything, and the
	// calls wait forever (the test then hangs in cleanup on its blocked handlers). Needs a
	// liveness signal in the transport: watching the bootstrap TCP connection (as brpc
	// does) or a transport-level keepalive; rpc's keepalive covers it one layer up.
	"TestDeadPeer/ibv":        "an idle RDMA QP does not notice its peer's QP being destroyed; the transport has no liveness signal of its own (bootstrap socket or keepalive)",
	"TestConcurrentCalls/ibv": "rxe stalls the send queue after an RNR NAK with READs outstanding; the RNR comes from Release messages outrunning the peer's reposted receives",
}

// ibvMissing is why the ibv fabric is left out; TestIBVFabric reports it.
var ibvMissing error

// TestIBVFabric says whether the end-to-end tests run over ibv, so that a build with the
// tag and no device does not pass silently.
func TestIBVFabric(t *testing.T) {
	if ibvMissing != nil {
		t.Skipf("SKIPPED: the ibv fabric is left out: no RDMA device (%v); run `make test-rxe` for Soft-RoCE in a VM", ibvMissing)
	}
	t.Logf("fabrics: %d, the last one %q", len(fabrics), fabrics[len(fabrics)-1].name)
}
