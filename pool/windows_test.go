package pool

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// newTestWindows returns a pool and a ring of n windows on one fake PD, torn down (and
// checked) at the end of the test.
func newTestWindows(t *testing.T, n int) (*Pool, *Windows, *fakePD) {
	t.Helper()
	p, pd := newTestPool(t, Config{Classes: []int{4096}})
	qp, _ := pd.CreateQP(verbs.QPInitAttr{})
	ws, err := NewWindows(pd, qp, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ws.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Windows.Close: %v", err)
		}
		if _, mws := pd.live(); mws != 0 {
			t.Errorf("%d windows not deallocated", mws)
		}
	})
	return p, ws, pd
}

func TestWindowsCycle(t *testing.T) {
	p, ws, _ := newTestWindows(t, 2)
	b := mustGet(t, p, 1000)
	defer b.Release()

	w, err := ws.Next()
	if err != nil {
		t.Fatal(err)
	}
	first := w.MW().RKey()
	if w.RKey() != verbs.IncRkey(first) || w.State() != WindowReserved {
		t.Fatalf("first Next: rkey 0x%x state %v, want IncRkey(0x%x) reserved", w.RKey(), w.State(), first)
	}
	before := time.Now()
	wr, err := ws.BindBufWR(w, b, verbs.AccessRemoteRead, 42)
	if err != nil {
		t.Fatal(err)
	}
	want := verbs.SendWR{WRID: 42, Opcode: verbs.WRBindMW, Bind: verbs.MWBind{
		MW: w.MW(), RKey: w.RKey(), MR: b.MR(), Addr: b.Addr(), Length: 1000, Access: verbs.AccessRemoteRead}}
	if wr.WRID != want.WRID || wr.Opcode != want.Opcode || wr.Flags != 0 || wr.Bind != want.Bind {
		t.Fatalf("bind WR %+v, want %+v", wr, want)
	}
	bd := w.Binding()
	if w.State() != WindowBound || bd.Buf != b || bd.RKey != w.RKey() || bd.Since.Before(before) || bd.Length != 1000 {
		t.Fatalf("after bind: state %v binding %+v", w.State(), bd)
	}

	// The peer's SEND_WITH_INV revokes it.
	got, err := ws.Invalidated(w.RKey())
	if err != nil || got.Buf != b || got.RKey != bd.RKey {
		t.Fatalf("Invalidated: %+v, %v", got, err)
	}
	if w.State() != WindowFree || w.Binding() != (Binding{}) {
		t.Fatalf("after invalidation: %v %+v", w.State(), w.Binding())
	}
	// Never twice.
	if _, err := ws.Invalidated(bd.RKey); !errors.Is(err, ErrWindowState) || !strings.Contains(err.Error(), "not bound") {
		t.Errorf("second Invalidated: %v", err)
	}
	if _, err := ws.LocalInvWR(w, 1); !errors.Is(err, ErrWindowState) {
		t.Errorf("LocalInvWR of a free window: %v", err)
	}

	// The ring hands out the least recently freed window: the other one, then w again
	// with the next rkey.
	w2, _ := ws.Next()
	if w2 == w {
		t.Fatal("Next reused the window just freed while another was free")
	}
	w3, _ := ws.Next()
	if w3 != w || w3.RKey() != verbs.IncRkey(bd.RKey) {
		t.Fatalf("third Next: window %d rkey 0x%x, want window %d rkey 0x%x", w3.Index(), w3.RKey(), w.Index(), verbs.IncRkey(bd.RKey))
	}
	if verbs.KeyIndex(w3.RKey()) != verbs.KeyIndex(first) {
		t.Errorf("IncRkey changed the index: 0x%x vs 0x%x", w3.RKey(), first)
	}

	// Exhausted: the error names the ring size. Nothing bound is handed out.
	if _, err := ws.Next(); !errors.Is(err, ErrWindowsExhausted) || !strings.Contains(err.Error(), "all 2 memory windows") {
		t.Errorf("Next on a full ring: %v", err)
	}

	// A stale rkey (the previous binding of w3) and an unknown one are refused.
	if _, err := ws.BindBufWR(w3, b, verbs.AccessRemoteRead, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Invalidated(bd.RKey); !errors.Is(err, ErrWindowState) || !strings.Contains(err.Error(), "stale") {
		t.Errorf("Invalidated(stale): %v", err)
	}
	if _, err := ws.Invalidated(verbs.MakeKey(0xabcdef, 1)); !errors.Is(err, ErrWindowState) {
		t.Errorf("Invalidated(unknown): %v", err)
	}

	// LOCAL_INV: signaled, once, and the window comes back on its completion.
	inv, err := ws.LocalInvWR(w3, 7)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Opcode != verbs.WRLocalInv || inv.InvalidateRKey != w3.RKey() || inv.Flags&verbs.SendSignaled == 0 || inv.WRID != 7 {
		t.Errorf("LOCAL_INV WR %+v", inv)
	}
	if _, err := ws.LocalInvWR(w3, 8); !errors.Is(err, ErrWindowState) || !strings.Contains(err.Error(), "only once") {
		t.Errorf("second LocalInvWR: %v", err)
	}
	if w3.State() != WindowInvalidating {
		t.Errorf("state %v", w3.State())
	}
	if _, err := ws.Invalidated(w3.RKey()); err != nil {
		t.Fatal(err)
	}

	// Cancel gives back a window whose bind was never posted, with its old rkey.
	w4, _ := ws.Next()
	r4 := w4.RKey()
	if err := ws.Cancel(w4); err != nil {
		t.Fatal(err)
	}
	if err := ws.Cancel(w4); !errors.Is(err, ErrWindowState) {
		t.Errorf("second Cancel: %v", err)
	}

	w5, _ := ws.Next()
	if w5 != w4 || w5.RKey() != r4 {
		t.Errorf("after Cancel: window %d rkey 0x%x, want window %d rkey 0x%x again", w5.Index(), w5.RKey(), w4.Index(), r4)
	}
	_ = ws.Cancel(w5)
	_ = ws.Cancel(w2)

	st := ws.Stats()
	wantSt := WindowStats{Windows: 2, Free: 2, Binds: 2, RemoteInvalidations: 1, LocalInvalidations: 1,
		Exhausted: 1, StaleInvalidations: 3, CanceledBinds: 3}
	if st != wantSt {
		t.Errorf("stats %+v\nwant  %+v", st, wantSt)
	}
}

func TestWindowsBindChecks(t *testing.T) {
	p, ws, pd := newTestWindows(t, 1)
	b := mustGet(t, p, 4096)
	defer b.Release()
	noBind, err := New(pd, Config{Classes: []int{4096}, Access: verbs.AccessRemoteRead})
	if err != nil {
		t.Fatal(err)
	}
	defer noBind.Close()
	nb := mustGet(t, noBind, 10)
	defer nb.Release()
	readOnly, err := New(pd, Config{Classes: []int{4096}, Access: verbs.AccessMWBind})
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close()
	ro := mustGet(t, readOnly, 10)
	defer ro.Release()

	w, _ := ws.Next()
	tests := []struct {
		name   string
		mr     verbs.MR
		addr   uint64
		length uint64
		access verbs.Access
		want   string
	}{
		{"length 0", b.MR(), b.Addr(), 0, verbs.AccessRemoteRead, "outside the region"},
		{"before the region", b.MR(), b.MR().Addr() - 1, 10, verbs.AccessRemoteRead, "outside the region"},
		{"past the region", b.MR(), b.MR().Addr(), uint64(len(b.MR().Bytes())) + 1, verbs.AccessRemoteRead, "outside the region"},
		{"no MW_BIND", nb.MR(), nb.Addr(), 10, verbs.AccessRemoteRead, "without MW_BIND"},
		{"remote write without LOCAL_WRITE", ro.MR(), ro.Addr(), 10, verbs.AccessRemoteWrite, "needs a region with LOCAL_WRITE"},
		{"nil region", nil, 0, 10, verbs.AccessRemoteRead, "nil memory region"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ws.BindWR(w, tt.mr, tt.addr, tt.length, tt.access, 1)
			if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("BindWR: %v, want ErrInvalid mentioning %q", err, tt.want)
			}
		})
	}
	if w.State() != WindowReserved {
		t.Errorf("a refused bind changed the state to %v", w.State())
	}
	// A window that Next did not hand out cannot be bound.
	if err := ws.Cancel(w); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.BindBufWR(w, b, verbs.AccessRemoteRead, 1); !errors.Is(err, ErrWindowState) {
		t.Errorf("bind of a free window: %v", err)
	}
	other, _ := newFakePD().CreateQP(verbs.QPInitAttr{})
	if _, err := NewWindows(pd, other, 1); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("NewWindows with a QP of another PD: %v", err)
	}
}

// TestWindowsHoldAndAnnounced: a held window's lease has not begun, however old its bind
// request is, but it is bound (a teardown releases it); Announced starts the lease then,
// and leaves a binding of another rkey alone.
func TestWindowsHoldAndAnnounced(t *testing.T) {
	p, ws, _ := newTestWindows(t, 1)
	b := mustGet(t, p, 100)
	w, err := ws.Next()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.BindBufWR(w, b, verbs.AccessRemoteRead, 1); err != nil {
		t.Fatal(err)
	}
	ws.Hold(w)
	later := time.Now().Add(time.Hour)
	if got := ws.Expired(later, time.Minute, nil); len(got) != 0 {
		t.Fatalf("a held window expired: %v", got)
	}
	if got := ws.Bound(nil); len(got) != 1 || got[0] != w { // what a teardown releases
		t.Fatalf("Bound with the window held: %v, want the window", got)
	}
	ws.Announced(w, w.RKey()+1) // another binding's rkey: still held
	if got := ws.Expired(later, time.Minute, nil); len(got) != 0 {
		t.Fatalf("Announced with another rkey released the hold: %v", got)
	}
	before := time.Now()
	ws.Announced(w, w.RKey())
	if since := w.Binding().Since; since.Before(before) {
		t.Errorf("Announced left Since at %v, before %v", since, before)
	}
	if got := ws.Expired(later, time.Minute, nil); len(got) != 1 || got[0] != w {
		t.Fatalf("Expired after Announced: %v, want the window", got)
	}
	if got := ws.Expired(time.Now(), time.Minute, nil); len(got) != 0 {
		t.Errorf("the lease did not restart at Announced: %v", got)
	}
	bd, err := ws.Invalidated(w.RKey())
	if err != nil {
		t.Fatal(err)
	}
	bd.Buf.Release()
}

func TestWindowsExpiredAndClose(t *testing.T) {
	p, ws, pd := newTestWindows(t, 3)
	var bufs []*Buf
	var wins []*Window
	for i := range 3 {
		b := mustGet(t, p, 100)
		w, err := ws.Next()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ws.BindBufWR(w, b, verbs.AccessRemoteRead, uint64(i)); err != nil {
			t.Fatal(err)
		}
		bufs, wins = append(bufs, b), append(wins, w)
		time.Sleep(2 * time.Millisecond)
	}
	now := time.Now()
	if got := ws.Expired(now, time.Hour, nil); len(got) != 0 {
		t.Errorf("Expired(1h) = %d windows", len(got))
	}
	lease := now.Sub(wins[1].Binding().Since)
	got := ws.Expired(now, lease, nil)
	if len(got) != 2 || got[0] != wins[0] || got[1] != wins[1] {
		t.Fatalf("Expired: %v, want the two oldest, oldest first", got)
	}
	for _, w := range got {
		wr, err := ws.Reclaim(w, 0)
		if err != nil || wr.Opcode != verbs.WRLocalInv {
			t.Fatalf("Reclaim: %+v %v", wr, err)
		}
	}
	if got := ws.Expired(now, lease, nil); len(got) != 0 {
		t.Errorf("windows being reclaimed are listed again: %v", got)
	}
	for _, w := range got {
		bd, err := ws.Invalidated(w.RKey())
		if err != nil {
			t.Fatal(err)
		}
		bd.Buf.Release()
	}
	st := ws.Stats()
	if st.Reclaims != 2 || st.LocalInvalidations != 2 || st.Bound != 1 || st.Free != 2 {
		t.Errorf("stats %+v", st)
	}

	// Close deallocates every window and names the one still bound.
	err := ws.Close()
	if !errors.Is(err, ErrWindowsBound) || !strings.Contains(err.Error(), "1 of 3 not free") {
		t.Errorf("Close: %v", err)
	}
	if _, mws := pd.live(); mws != 0 {
		t.Errorf("%d windows left", mws)
	}
	if _, err := ws.Next(); !errors.Is(err, ErrClosed) {
		t.Errorf("Next after Close: %v", err)
	}
	bufs[2].Release()
}
