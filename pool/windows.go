package pool

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Errors of the window allocator; match them with errors.Is.
var (
	// ErrWindowsExhausted is returned by Next when every window of the ring is bound or
	// being invalidated. The error names the ring size.
	ErrWindowsExhausted = errors.New("no free memory window")
	// ErrWindowState is a call that does not fit the window's state: a bind of a window
	// Next did not hand out, a second invalidation of one binding, an invalidation of an
	// unknown or stale rkey.
	ErrWindowState = errors.New("memory window in the wrong state")
	// ErrWindowsBound is reported by Windows.Close for windows still bound.
	ErrWindowsBound = errors.New("memory windows still bound")
)

// WindowState is where a window is in its cycle: Free -> Reserved (Next) -> Bound (BindWR)
// -> Invalidating (LocalInvWR, Reclaim) -> Free (Invalidated); a peer's SEND_WITH_INV takes
// a window from Bound straight to Free (Invalidated), and Cancel takes a Reserved or Bound
// window whose bind was never posted back to Free.
type WindowState uint8

// Window states.
const (
	WindowFree         WindowState = iota // in the free ring
	WindowReserved                        // handed out by Next; no bind built yet
	WindowBound                           // a BIND_MW was built: the window exposes memory
	WindowInvalidating                    // a LOCAL_INV was built; waiting for its completion
)

var windowStateNames = [...]string{"free", "reserved", "bound", "invalidating"}

// String returns the state's name, for example "bound".
func (s WindowState) String() string {
	if int(s) < len(windowStateNames) {
		return windowStateNames[s]
	}
	return fmt.Sprintf("WindowState(%d)", uint8(s))
}

// Binding is what a window exposes: recorded when the bind work request is built, for the
// transport to release the buffer on invalidation and to reclaim on lease expiry.
type Binding struct {
	RKey   uint32       // the window's rkey for this binding
	MR     verbs.MR     // the region the window lies in
	Addr   uint64       // first byte exposed (a virtual address of MR)
	Length uint64       // bytes exposed
	Access verbs.Access // rights granted
	Buf    *Buf         // the buffer exposed, if bound with BindBufWR
	Since  time.Time    // when the bind work request was built, or the lease began (Announced)
	// Written is, on a device whose windows count it (verbs.WritePrefixer; WrittenKnown),
	// the prefix of the window the peer's RDMA WRITEs covered, read by Invalidated.
	Written      uint64
	WrittenKnown bool
}

// Window is a type-2 memory window of a Windows ring.
type Window struct {
	ws  *Windows
	mw  verbs.MW
	idx int

	// Guarded by ws.mu.
	state WindowState
	rkey  uint32 // the rkey of the current (or last) binding; the MW's own before the first
	prev  uint32 // rkey before Next, restored by Cancel
	bind  Binding
	held  bool // bound but not yet announced to the peer (Hold): its lease has not begun
}

// Windows is the allocator of a queue pair's type-2 memory windows: a ring of windows
// used in least-recently-freed order, so that an rkey comes back (after 256 binds of one
// window) as late as possible. Type-2 windows are bound through one QP and usable only
// through it, so each connection has its own Windows. Its methods are safe for concurrent
// use; they share one mutex per Windows, never a global one.
type Windows struct {
	pd verbs.PD
	qp verbs.QP

	mu     sync.Mutex
	wins   []Window
	byKey  map[uint32]*Window // window by verbs.KeyIndex of its rkey
	free   []int              // ring of free windows
	head   int                // next free window: free[head]
	nfree  int
	closed bool
	stats  WindowStats
}

// WindowStats are the counters of a Windows.
type WindowStats struct {
	Windows      int // ring size
	Free         int
	Reserved     int
	Bound        int
	Invalidating int

	Binds               uint64 // BIND_MW work requests built
	RemoteInvalidations uint64 // bindings revoked by the peer's SEND_WITH_INV
	LocalInvalidations  uint64 // bindings revoked by our LOCAL_INV, completed
	Reclaims            uint64 // LOCAL_INVs built by Reclaim (lease expiry, teardown)
	Exhausted           uint64 // Next calls that found no free window
	StaleInvalidations  uint64 // Invalidated calls refused: unknown, stale or not bound
	CanceledBinds       uint64 // Cancel calls
}

// NewWindows allocates n type-2 memory windows on pd for binding through qp (which must
// belong to pd).
func NewWindows(pd verbs.PD, qp verbs.QP, n int) (*Windows, error) {
	if pd == nil || qp == nil || n <= 0 {
		return nil, fmt.Errorf("pool: new windows: need a PD, a QP and n > 0 (n = %d): %w", n, verbs.ErrInvalid)
	}
	if qp.PD() != pd {
		return nil, fmt.Errorf("pool: new windows: QP %d belongs to another protection domain: %w", qp.Num(), verbs.ErrInvalid)
	}
	ws := &Windows{pd: pd, qp: qp, wins: make([]Window, n), byKey: make(map[uint32]*Window, n), free: make([]int, n), nfree: n}
	for i := range ws.wins {
		mw, err := pd.AllocMW(verbs.MWType2)
		if err == nil && ws.byKey[verbs.KeyIndex(mw.RKey())] != nil {
			err = fmt.Errorf("provider returned rkey 0x%x twice", mw.RKey())
			_ = mw.Dealloc()
		}
		if err != nil {
			var errs []error
			for j := range i {
				errs = append(errs, ws.wins[j].mw.Dealloc())
			}
			return nil, errors.Join(fmt.Errorf("pool: allocate type-2 memory window %d of %d: %w", i+1, n, err), errors.Join(errs...))
		}
		w := &ws.wins[i]
		*w = Window{ws: ws, mw: mw, idx: i, rkey: mw.RKey()}
		ws.byKey[verbs.KeyIndex(w.rkey)] = w
		ws.free[i] = i
	}
	return ws, nil
}

// Len returns the number of windows in the ring.
func (ws *Windows) Len() int { return len(ws.wins) }

// Next takes the least recently freed window and gives it its next rkey,
// verbs.IncRkey(rkey of its last binding) (IncRkey(mw.RKey()) on the first bind). The
// window is Reserved until BindWR or BindBufWR, or Cancel. When every window is bound
// or being invalidated, Next fails with ErrWindowsExhausted; it never hands out a window
// that is still bound.
func (ws *Windows) Next() (*Window, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return nil, fmt.Errorf("pool: next window: %w", ErrClosed)
	}
	if ws.nfree == 0 {
		ws.stats.Exhausted++
		return nil, fmt.Errorf("pool: next window: all %d memory windows of QP %d are bound or being invalidated: %w",
			len(ws.wins), ws.qp.Num(), ErrWindowsExhausted)
	}
	w := &ws.wins[ws.free[ws.head]]
	ws.head = (ws.head + 1) % len(ws.free)
	ws.nfree--
	if w.state != WindowFree {
		return nil, fmt.Errorf("pool: next window: refusing window %d (rkey 0x%x): it is %v: %w", w.idx, w.rkey, w.state, ErrWindowState)
	}
	w.prev = w.rkey
	w.rkey = verbs.IncRkey(w.rkey)
	w.state = WindowReserved
	return w, nil
}

// pushFree appends w to the free ring. ws.mu must be held.
func (ws *Windows) pushFree(w *Window) {
	w.state = WindowFree
	w.bind = Binding{}
	w.held = false
	ws.free[(ws.head+ws.nfree)%len(ws.free)] = w.idx
	ws.nfree++
}

// BindWR builds the BIND_MW work request that binds w, Reserved by Next, over length
// bytes at addr of mr with the given access, and records the binding (Since is now). The
// request is unsignaled: set verbs.SendSignaled in Flags for a completion. Post it on the
// Windows' QP; a SEND posted after it on the same QP may carry w.RKey() to the peer (the
// bind is ordered before it). If the post fails, Cancel the window.
//
// BindWR checks what the NIC would refuse with MW_BIND_ERR: a range outside mr, a length
// of 0, mr without AccessMWBind, or remote-write access over mr without AccessLocalWrite.
func (ws *Windows) BindWR(w *Window, mr verbs.MR, addr, length uint64, access verbs.Access, wrid uint64) (verbs.SendWR, error) {
	return ws.bind(w, mr, addr, length, access, wrid, nil)
}

// BindBufWR is BindWR over exactly the Len bytes of b, recording b in the binding.
func (ws *Windows) BindBufWR(w *Window, b *Buf, access verbs.Access, wrid uint64) (verbs.SendWR, error) {
	return ws.bind(w, b.MR(), b.Addr(), uint64(b.Len()), access, wrid, b)
}

func (ws *Windows) bind(w *Window, mr verbs.MR, addr, length uint64, access verbs.Access, wrid uint64, b *Buf) (verbs.SendWR, error) {
	if mr == nil {
		return verbs.SendWR{}, fmt.Errorf("pool: bind window: nil memory region: %w", verbs.ErrInvalid)
	}
	start, end := mr.Addr(), mr.Addr()+uint64(len(mr.Bytes()))
	switch {
	case length == 0 || addr < start || addr > end || length > end-addr:
		return verbs.SendWR{}, fmt.Errorf("pool: bind window: range 0x%x+%d outside the region 0x%x..0x%x: %w", addr, length, start, end, verbs.ErrInvalid)
	case mr.Access()&verbs.AccessMWBind == 0:
		return verbs.SendWR{}, fmt.Errorf("pool: bind window: region registered with %v, without MW_BIND: %w", mr.Access(), verbs.ErrInvalid)
	case access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && mr.Access()&verbs.AccessLocalWrite == 0:
		return verbs.SendWR{}, fmt.Errorf("pool: bind window: %v needs a region with LOCAL_WRITE, it has %v: %w", access, mr.Access(), verbs.ErrInvalid)
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if err := ws.own(w, "bind"); err != nil {
		return verbs.SendWR{}, err
	}
	if w.state != WindowReserved {
		return verbs.SendWR{}, fmt.Errorf("pool: bind window %d (rkey 0x%x): it is %v, not reserved by Next: %w", w.idx, w.rkey, w.state, ErrWindowState)
	}
	w.state, w.held = WindowBound, false
	w.bind = Binding{RKey: w.rkey, MR: mr, Addr: addr, Length: length, Access: access, Buf: b, Since: time.Now()}
	ws.stats.Binds++
	return verbs.SendWR{
		WRID:   wrid,
		Opcode: verbs.WRBindMW,
		Bind:   verbs.MWBind{MW: w.mw, RKey: w.rkey, MR: mr, Addr: addr, Length: length, Access: access},
	}, nil
}

// own checks that w is one of ws's windows and ws is open. ws.mu must be held.
func (ws *Windows) own(w *Window, op string) error {
	if ws.closed {
		return fmt.Errorf("pool: %s window: %w", op, ErrClosed)
	}
	if w == nil || w.ws != ws {
		return fmt.Errorf("pool: %s window: not a window of QP %d: %w", op, ws.qp.Num(), verbs.ErrInvalid)
	}
	return nil
}

// Cancel returns a window whose bind work request was never posted (or was refused at
// post time) to the free ring, with its previous rkey: the NIC never saw the new one.
// Do not cancel a window whose bind was posted; invalidate it.
func (ws *Windows) Cancel(w *Window) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if err := ws.own(w, "cancel"); err != nil {
		return err
	}
	if w.state != WindowReserved && w.state != WindowBound {
		return fmt.Errorf("pool: cancel window %d (rkey 0x%x): it is %v: %w", w.idx, w.rkey, w.state, ErrWindowState)
	}
	w.rkey = w.prev
	ws.pushFree(w)
	ws.stats.CanceledBinds++
	return nil
}

// LocalInvWR builds the signaled LOCAL_INV work request that revokes w's binding and
// marks w Invalidating. Call Invalidated(w.RKey()) when it completes successfully. A
// binding is invalidated once: a second call, or a call on a window that is not bound,
// fails with ErrWindowState (against rxe a second invalidation of one binding is unsafe).
func (ws *Windows) LocalInvWR(w *Window, wrid uint64) (verbs.SendWR, error) {
	return ws.invalidate(w, wrid, false)
}

// Reclaim is LocalInvWR for a binding the peer did not release: one Expired returned,
// or one still bound when the connection is torn down. It counts a reclaim.
func (ws *Windows) Reclaim(w *Window, wrid uint64) (verbs.SendWR, error) {
	return ws.invalidate(w, wrid, true)
}

func (ws *Windows) invalidate(w *Window, wrid uint64, reclaim bool) (verbs.SendWR, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if err := ws.own(w, "invalidate"); err != nil {
		return verbs.SendWR{}, err
	}
	if w.state != WindowBound {
		return verbs.SendWR{}, fmt.Errorf("pool: invalidate window %d (rkey 0x%x): it is %v, not bound; a binding is invalidated only once: %w",
			w.idx, w.rkey, w.state, ErrWindowState)
	}
	w.state = WindowInvalidating
	if reclaim {
		ws.stats.Reclaims++
	}
	return verbs.SendWR{WRID: wrid, Opcode: verbs.WRLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: w.rkey}, nil
}

// Invalidated records that the binding with rkey was revoked: the peer's SEND_WITH_INV
// arrived (a receive completion with verbs.WCWithInv and InvalidatedRKey == rkey), or
// our LOCAL_INV of it completed. The window returns to the free ring and the binding is
// returned, so the caller can release its buffer. An rkey that is not the current binding
// of one of the ring's windows, or a window not bound, fails with ErrWindowState. A
// window with a LOCAL_INV in flight counts as locally invalidated even if the peer's
// SEND_WITH_INV got there first; the binding was then invalidated twice on the NIC, which
// is unsafe on rxe, so reclaim only after a lease no live peer can still be inside.
func (ws *Windows) Invalidated(rkey uint32) (Binding, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return Binding{}, fmt.Errorf("pool: invalidated 0x%x: %w", rkey, ErrClosed)
	}
	w := ws.byKey[verbs.KeyIndex(rkey)]
	switch {
	case w == nil:
		ws.stats.StaleInvalidations++
		return Binding{}, fmt.Errorf("pool: invalidated rkey 0x%x: not a window of QP %d: %w", rkey, ws.qp.Num(), ErrWindowState)
	case w.rkey != rkey:
		ws.stats.StaleInvalidations++
		return Binding{}, fmt.Errorf("pool: invalidated rkey 0x%x: stale, window %d is at 0x%x: %w", rkey, w.idx, w.rkey, ErrWindowState)
	case w.state == WindowBound:
		ws.stats.RemoteInvalidations++
	case w.state == WindowInvalidating:
		ws.stats.LocalInvalidations++
	default:
		ws.stats.StaleInvalidations++
		return Binding{}, fmt.Errorf("pool: invalidated rkey 0x%x: window %d is %v, not bound (invalidated twice?): %w", rkey, w.idx, w.state, ErrWindowState)
	}
	b := w.bind
	if p, ok := w.mw.(verbs.WritePrefixer); ok { // before the window is free: a new bind resets it
		b.Written, b.WrittenKnown = p.WrittenPrefix(), true
	}
	ws.pushFree(w)
	return b, nil
}

// Hold keeps the lease of w's binding from running while its announcement waits to be
// posted (for a credit, say): Expired skips a held window, and Announced starts the lease.
// Without it the lease runs from the bind request's making, and a binding that waited
// longer than the lease for its announcement would be reclaimed as the peer reads it.
func (ws *Windows) Hold(w *Window) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.own(w, "hold") == nil && w.state == WindowBound {
		w.held = true
	}
}

// Announced starts the lease of w's held binding with rkey now (Since), once the work
// request that announces it to the peer is posted. By then the peer may have revoked it
// and w been bound again: a binding of another rkey is left alone.
func (ws *Windows) Announced(w *Window, rkey uint32) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.own(w, "announced") == nil && w.state == WindowBound && w.held && w.rkey == rkey {
		w.held, w.bind.Since = false, time.Now()
	}
}

// Expired appends to dst the Bound windows whose binding is at least lease old at now,
// oldest binding first, and returns the extended slice; held windows (Hold) are not.
// Reclaim each to revoke it.
func (ws *Windows) Expired(now time.Time, lease time.Duration, dst []*Window) []*Window {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	first := len(dst)
	for i := range ws.wins {
		w := &ws.wins[i]
		if w.state == WindowBound && !w.held && now.Sub(w.bind.Since) >= lease {
			dst = append(dst, w)
		}
	}
	out := dst[first:]
	for i := 1; i < len(out); i++ { // insertion sort: few windows expire at once
		for j := i; j > 0 && out[j].bind.Since.Before(out[j-1].bind.Since); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return dst
}

// Bound appends to dst every Bound window, held (Hold) or not, and returns the extended
// slice: what a connection's teardown releases. A sender whose announcement was not
// posted, or posted only as the teardown ran, leaves its binding's buffer to the teardown
// once the connection is torn down, so a held binding is the teardown's to release too.
func (ws *Windows) Bound(dst []*Window) []*Window {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for i := range ws.wins {
		if w := &ws.wins[i]; w.state == WindowBound {
			dst = append(dst, w)
		}
	}
	return dst
}

// Stats returns a snapshot of the counters.
func (ws *Windows) Stats() WindowStats {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	st := ws.stats
	st.Windows = len(ws.wins)
	for i := range ws.wins {
		switch ws.wins[i].state {
		case WindowFree:
			st.Free++
		case WindowReserved:
			st.Reserved++
		case WindowBound:
			st.Bound++
		case WindowInvalidating:
			st.Invalidating++
		}
	}
	return st
}

// Close deallocates every window (which also invalidates those still bound) and reports
// the ones that were not free, with what they exposed, as an error matching
// ErrWindowsBound. Their buffers are the caller's to release.
func (ws *Windows) Close() error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return fmt.Errorf("pool: close windows: %w", ErrClosed)
	}
	ws.closed = true
	var busy []string
	var errs []error
	for i := range ws.wins {
		w := &ws.wins[i]
		if w.state != WindowFree {
			busy = append(busy, fmt.Sprintf("window %d rkey 0x%x %v over 0x%x+%d since %v",
				w.idx, w.rkey, w.state, w.bind.Addr, w.bind.Length, w.bind.Since.Format(time.RFC3339Nano)))
		}
		if err := w.mw.Dealloc(); err != nil {
			errs = append(errs, fmt.Errorf("pool: deallocate window %d: %w", w.idx, err))
		}
	}
	if len(busy) > 0 {
		errs = append([]error{fmt.Errorf("pool: close windows of QP %d: %d of %d not free: %s: %w",
			ws.qp.Num(), len(busy), len(ws.wins), strings.Join(busy, "; "), ErrWindowsBound)}, errs...)
	}
	return errors.Join(errs...)
}

// RKey returns the rkey of the window's current binding (from Next on), or of its last.
func (w *Window) RKey() uint32 {
	w.ws.mu.Lock()
	defer w.ws.mu.Unlock()
	return w.rkey
}

// State returns the window's state.
func (w *Window) State() WindowState {
	w.ws.mu.Lock()
	defer w.ws.mu.Unlock()
	return w.state
}

// Binding returns what the window exposes (the zero Binding when it is free or reserved).
func (w *Window) Binding() Binding {
	w.ws.mu.Lock()
	defer w.ws.mu.Unlock()
	return w.bind
}

// MW returns the memory window.
func (w *Window) MW() verbs.MW { return w.mw }

// Index returns the window's position in its ring.
func (w *Window) Index() int { return w.idx }
