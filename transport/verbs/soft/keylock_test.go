package soft

import (
	"testing"
	"time"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestDeregWaitsForTransfers: Dereg returns only once the transfers that checked the
// region's key before it went away have ended, whichever QPs' stripes they counted in
// and ended in; and a check after Dereg began fails.
func TestDeregWaitsForTransfers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		endOnPeer bool // the transfer ends in the other QP's stripe
	}{
		{"ended in its own stripe", false},
		{"ended in another stripe", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewFabric().Open("d")
			if err != nil {
				t.Fatal(err)
			}
			h := newHost(t, d, 1<<16)
			defer h.close(t)
			other, err := h.pd.CreateQP(verbs.QPInitAttr{SendCQ: h.cq, RecvCQ: h.cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Destroy()
			q, p := h.qp.(*QP), other.(*QP)
			if q.stripe == p.stripe {
				t.Fatalf("two QPs made one after another share stripe %d", q.stripe)
			}
			mr, err := h.pd.RegMR(h.mem.Bytes()[:4096], verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			sge := verbs.SGE{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}
			_, m, ok := q.resolveLocal(sge, true)
			if !ok {
				t.Fatal("the region's key did not check")
			}
			deregged := make(chan error, 1)
			go func() { deregged <- mr.Dereg() }()
			select {
			case err := <-deregged:
				t.Fatalf("Dereg returned (%v) with a transfer in progress", err)
			case <-time.After(20 * time.Millisecond):
			}
			if _, _, ok := p.resolveLocal(sge, true); ok {
				t.Fatal("the key of a region being deregistered still checks")
			}
			ender := q
			if tc.endOnPeer {
				ender = p
			}
			m.release(ender.stripe)
			select {
			case err := <-deregged:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Dereg still waits after the transfer ended (%d counted)", m.dma.sum())
			}
		})
	}
}

// TestStripeLayout: each stripe of the key lock and of a region's transfer count fills its
// own lines, and the first starts a line after whatever precedes the stripes, so that
// one QP's writes never invalidate another stripe or the fields key checks read.
func TestStripeLayout(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, stride uintptr
	}{
		{"key lock", unsafe.Offsetof(keyLock{}.stripes), unsafe.Sizeof(paddedRW{})},
		{"transfer count", unsafe.Offsetof(transfers{}.stripes), unsafe.Sizeof(paddedCount{})},
	} {
		if tc.first < cacheLine || tc.stride != cacheLine {
			t.Errorf("%s: first stripe at byte %d, stripes %d bytes apart; want at least %d and %d", tc.name, tc.first, tc.stride, cacheLine, cacheLine)
		}
	}
}
