package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// mr is a registered memory region. Its state (valid, bound windows) is guarded by the
// device's keyMu; dma counts transfers in progress so that Dereg can wait for them and the
// memory is never unpinned under the engine (draining: Dereg waits, a transfer that ends
// wakes it).
type mr struct {
	dev    *Device
	pd     *pd
	domain *parentDomain // registered on it (its count), or nil
	mem    *verbs.Memory
	buf    []byte
	addr   uint64 // virtual address of buf[0]
	access verbs.Access
	key    uint32 // lkey == rkey

	valid   bool // keyMu
	windows int  // bound windows; keyMu

	dma      transfers
	dmaMu    sync.Mutex
	dmaCond  *sync.Cond
	draining atomic.Bool
}

func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("soft: reg MR: %v requires LOCAL_WRITE: %w", access, verbs.ErrInvalid)
	}
	if access&^(verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic|verbs.AccessMWBind|verbs.AccessZeroBased) != 0 {
		return nil, fmt.Errorf("soft: reg MR: unknown access flags %v: %w", access, verbs.ErrInvalid)
	}
	if uint64(len(buf)) > MaxMessage {
		return nil, fmt.Errorf("soft: reg MR of %d bytes (max %d): %w", len(buf), uint64(MaxMessage), verbs.ErrInvalid)
	}
	if err := p.use(); err != nil {
		return nil, err
	}
	mem, err := verbs.Pin(buf)
	if err != nil {
		p.unuse()
		return nil, err
	}
	m := &mr{dev: p.dev, pd: p, mem: mem, buf: buf, addr: verbs.AddrOf(buf), access: access, valid: true}
	m.dmaCond = sync.NewCond(&m.dmaMu)
	d := p.dev
	d.keyMu.Lock()
	idx, err := d.addKey(keyEntry{mr: m})
	if err == nil {
		m.key = verbs.MakeKey(idx, randomKey8())
	}
	d.keyMu.Unlock()
	if err != nil {
		mem.Unpin()
		p.unuse()
		return nil, err
	}
	return m, nil
}

func (m *mr) LKey() uint32         { return m.key }
func (m *mr) RKey() uint32         { return m.key }
func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Bytes() []byte        { return m.buf }
func (m *mr) Access() verbs.Access { return m.access }

func (m *mr) Dereg() error {
	d := m.dev
	d.keyMu.Lock()
	if !m.valid {
		d.keyMu.Unlock()
		return fmt.Errorf("soft: dereg MR 0x%x: %w", m.key, verbs.ErrClosed)
	}
	if m.windows > 0 {
		n := m.windows
		d.keyMu.Unlock()
		return fmt.Errorf("soft: dereg MR 0x%x: %d memory windows bound to it (invalidate or dealloc them first): %w", m.key, n, verbs.ErrBusy)
	}
	m.valid = false
	d.dropKey(verbs.KeyIndex(m.key))
	d.keyMu.Unlock()
	// Wait for transfers that checked the key before it went away. A transfer that ends
	// after draining is set wakes this; one that ended before it is in the sum.
	m.dmaMu.Lock()
	m.draining.Store(true)
	for m.dma.sum() > 0 {
		m.dmaCond.Wait()
	}
	m.dmaMu.Unlock()
	m.mem.Unpin()
	m.pd.unuse()
	m.domain.release()
	return nil
}

// acquire counts one transfer touching the region in stripe i (its QP's); keyMu (read)
// must be held and the region valid, or the transfer must hold a reference in stripe i
// already. release(i) ends it.
func (m *mr) acquire(i uint32) { m.dma.add(i, 1) }

func (m *mr) release(i uint32) {
	m.dma.add(i, -1)
	if m.draining.Load() {
		m.dmaMu.Lock()
		m.dmaCond.Broadcast()
		m.dmaMu.Unlock()
	}
}

// slice returns length bytes at virtual address addr, or false if they are not all inside
// the region. A zero-based region takes addr as an offset.
func (m *mr) slice(addr uint64, length uint64) ([]byte, bool) {
	off := addr
	if m.access&verbs.AccessZeroBased == 0 {
		if addr < m.addr {
			return nil, false
		}
		off = addr - m.addr
	}
	if off > uint64(len(m.buf)) || length > uint64(len(m.buf))-off {
		return nil, false
	}
	return m.buf[off : off+length], true
}

// mw is a memory window. Its binding is guarded by the device's keyMu.
type mw struct {
	dev    *Device
	pd     *pd
	domain *parentDomain // allocated on it (its count), or nil
	typ    verbs.MWType

	key     uint32 // the NIC's current rkey; keyMu
	userKey atomic.Uint32
	alive   bool // keyMu

	bound     bool // keyMu
	mr        *mr
	start     uint64 // virtual address of the window's first byte
	length    uint64
	access    verbs.Access
	qp        *QP // type 2: the only QP that may use the window
	zeroBased bool
	// written is the prefix of the window that RDMA WRITEs through it covered since its
	// bind (WrittenPrefix). Noted when a WRITE's target is resolved, before its bytes are
	// placed: a WRITE whose payload does not arrive whole breaks the stream, and with it
	// every message after it (the SEND_WITH_INV that would have revoked the window too).
	written atomic.Uint64
}

// WrittenPrefix implements verbs.WritePrefixer.
func (w *mw) WrittenPrefix() uint64 { return w.written.Load() }

// noteWrite extends the written prefix by a WRITE of n bytes at offset off in the window,
// when it starts inside the prefix. One QP's responder writes a type-2 window at a time.
func (w *mw) noteWrite(off, n uint64) {
	if p := w.written.Load(); off <= p && off+n > p {
		w.written.Store(off + n)
	}
}

func (p *pd) AllocMW(t verbs.MWType) (verbs.MW, error) {
	if t != verbs.MWType1 && t != verbs.MWType2 {
		return nil, fmt.Errorf("soft: alloc MW of unknown %v: %w", t, verbs.ErrInvalid)
	}
	if err := p.use(); err != nil {
		return nil, err
	}
	w := &mw{dev: p.dev, pd: p, typ: t, alive: true}
	d := p.dev
	d.keyMu.Lock()
	idx, err := d.addKey(keyEntry{mw: w})
	if err == nil {
		w.key = verbs.MakeKey(idx, randomKey8())
		w.userKey.Store(w.key)
	}
	d.keyMu.Unlock()
	if err != nil {
		p.unuse()
		return nil, err
	}
	return w, nil
}

func (w *mw) Type() verbs.MWType { return w.typ }
func (w *mw) RKey() uint32       { return w.userKey.Load() }

func (w *mw) Bind(qp verbs.QP, wrid uint64, flags verbs.SendFlags, b verbs.MWBind) (uint32, error) {
	if w.typ != verbs.MWType1 {
		return 0, fmt.Errorf("soft: MW.Bind on a %v window (type 2 binds with a BIND_MW work request): %w", w.typ, verbs.ErrInvalid)
	}
	if b.Access&verbs.AccessZeroBased != 0 {
		return 0, fmt.Errorf("soft: MW.Bind: a type-1 window cannot be zero-based: %w", verbs.ErrInvalid)
	}
	q, ok := qp.(*QP)
	if !ok {
		return 0, fmt.Errorf("soft: MW.Bind through a QP of another provider: %w", verbs.ErrInvalid)
	}
	b.MW = w
	b.RKey = verbs.IncRkey(w.userKey.Load())
	wr := [1]verbs.SendWR{{WRID: wrid, Opcode: verbs.WRBindMW, Flags: flags, Bind: b}}
	if err := q.PostSend(wr[:]); err != nil {
		return 0, err
	}
	w.userKey.Store(b.RKey)
	return b.RKey, nil
}

func (w *mw) Dealloc() error {
	d := w.dev
	d.keyMu.Lock()
	if !w.alive {
		d.keyMu.Unlock()
		return fmt.Errorf("soft: dealloc MW 0x%x: %w", w.key, verbs.ErrClosed)
	}
	w.unbind()
	w.alive = false
	d.dropKey(verbs.KeyIndex(w.key))
	d.keyMu.Unlock()
	w.pd.unuse()
	w.domain.release()
	return nil
}

// unbind drops the window's binding; keyMu must be held for writing.
func (w *mw) unbind() {
	if w.bound {
		w.mr.windows--
	}
	w.bound, w.mr, w.qp = false, nil, nil
}

// bind executes a BIND_MW work request posted on q: the checks of the IBTA (and rxe's
// rxe_check_bind_mw), then the new binding. It returns a description of the violation, or
// "" on success.
func (q *QP) bind(b *verbs.MWBind) string {
	w, ok := b.MW.(*mw)
	if !ok || w == nil {
		return "window of another provider"
	}
	m, _ := b.MR.(*mr)
	d := q.dev
	d.keyMu.Lock()
	defer d.keyMu.Unlock()
	switch {
	case !w.alive:
		return "window deallocated"
	case w.dev != d:
		return "window of another device"
	case verbs.KeyIndex(b.RKey) != verbs.KeyIndex(w.key):
		return fmt.Sprintf("rkey 0x%x does not name window 0x%x (stale key)", b.RKey, w.key)
	case w.typ == verbs.MWType2 && w.bound:
		return "type-2 window is already bound"
	case w.pd != q.pd:
		return "window's PD differs from the QP's"
	case m == nil || !m.valid:
		return "memory region invalid"
	case m.pd != q.pd:
		return "memory region's PD differs from the QP's"
	case b.Length == 0:
		return "zero-length bind"
	case m.access&verbs.AccessZeroBased != 0:
		return "memory region is zero-based"
	case m.access&verbs.AccessMWBind == 0:
		return "memory region lacks MW_BIND access"
	case b.Access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && m.access&verbs.AccessLocalWrite == 0:
		return "writable window over a region without LOCAL_WRITE"
	}
	if _, ok := m.slice(b.Addr, b.Length); !ok {
		return fmt.Sprintf("window [0x%x,+%d) outside the region [0x%x,+%d)", b.Addr, b.Length, m.addr, len(m.buf))
	}
	w.unbind()
	w.bound, w.mr, w.start, w.length = true, m, b.Addr, b.Length
	w.written.Store(0)
	w.access = b.Access &^ verbs.AccessZeroBased
	w.zeroBased = b.Access&verbs.AccessZeroBased != 0
	if w.typ == verbs.MWType2 {
		w.qp = q
	}
	w.key = verbs.MakeKey(verbs.KeyIndex(w.key), verbs.Key8(b.RKey))
	m.windows++
	return ""
}

// invalidate revokes the type-2 window named by rkey, for LOCAL_INV (remote == false) or a
// received SEND_WITH_INV (remote == true) on q. It returns the violation, or "".
func (q *QP) invalidate(rkey uint32, remote bool) string {
	d := q.dev
	d.keyMu.Lock()
	defer d.keyMu.Unlock()
	e := d.entry(rkey)
	switch {
	case e.mr != nil:
		return fmt.Sprintf("key 0x%x names a memory region, not a window", rkey)
	case e.mw == nil:
		return fmt.Sprintf("key 0x%x names no window", rkey)
	}
	w := e.mw
	switch {
	case w.typ != verbs.MWType2:
		return "type-1 windows cannot be invalidated"
	case w.key != rkey:
		return fmt.Sprintf("stale key 0x%x (window is 0x%x)", rkey, w.key)
	case !w.bound:
		return "window is not bound"
	case w.pd != q.pd:
		return "window's PD differs from the QP's"
	case remote && w.qp != q:
		return "window is bound to another QP"
	}
	w.unbind()
	return ""
}

// resolveRemote checks rkey for a remote access of length bytes at addr through q with the
// given right, as the responder engine of real hardware does, and returns the bytes with the
// region acquired (the caller must release it). keyMu must not be held.
func (q *QP) resolveRemote(rkey uint32, addr, length uint64, right verbs.Access) ([]byte, *mr, string) {
	d := q.dev
	d.keyMu.rlock(q.stripe)
	defer d.keyMu.runlock(q.stripe)
	e := d.entry(rkey)
	switch {
	case e.mr != nil:
		m := e.mr
		switch {
		case m.key != rkey || !m.valid:
			return nil, nil, fmt.Sprintf("stale key 0x%x", rkey)
		case m.pd != q.pd:
			return nil, nil, "region's PD differs from the QP's"
		case m.access&right == 0:
			return nil, nil, fmt.Sprintf("region lacks %v", right)
		}
		b, ok := m.slice(addr, length)
		if !ok {
			return nil, nil, fmt.Sprintf("[0x%x,+%d) outside the region", addr, length)
		}
		m.acquire(q.stripe)
		return b, m, ""
	case e.mw != nil:
		w := e.mw
		switch {
		case w.key != rkey:
			return nil, nil, fmt.Sprintf("stale key 0x%x (window is 0x%x)", rkey, w.key)
		case !w.alive || !w.bound:
			return nil, nil, "window not bound"
		case w.pd != q.pd:
			return nil, nil, "window's PD differs from the QP's"
		case w.typ == verbs.MWType2 && w.qp != q:
			return nil, nil, "window is bound to another QP"
		case w.access&right == 0:
			return nil, nil, fmt.Sprintf("window lacks %v", right)
		}
		va := addr
		if w.zeroBased {
			va = w.start + addr
			if va < addr {
				return nil, nil, "address overflow"
			}
		}
		// The IBTA bounds check on the window itself (rxe checks only the region).
		if va < w.start || va-w.start > w.length || length > w.length-(va-w.start) {
			return nil, nil, fmt.Sprintf("[0x%x,+%d) outside the window [0x%x,+%d)", va, length, w.start, w.length)
		}
		b, ok := w.mr.slice(va, length)
		if !ok || !w.mr.valid {
			return nil, nil, "outside the region"
		}
		if right == verbs.AccessRemoteWrite {
			w.noteWrite(va-w.start, length)
		}
		w.mr.acquire(q.stripe)
		return b, w.mr, ""
	}
	return nil, nil, fmt.Sprintf("key 0x%x names nothing", rkey)
}

// resolveLocal checks one SGE of a work request posted on q (lkey, PD, bounds and, when
// write is set, LOCAL_WRITE) and returns its bytes with the region acquired.
func (q *QP) resolveLocal(s verbs.SGE, write bool) ([]byte, *mr, bool) {
	d := q.dev
	d.keyMu.rlock(q.stripe)
	defer d.keyMu.runlock(q.stripe)
	m := d.entry(s.LKey).mr
	if m == nil || m.key != s.LKey || !m.valid || m.pd != q.pd {
		return nil, nil, false
	}
	if write && m.access&verbs.AccessLocalWrite == 0 {
		return nil, nil, false
	}
	b, ok := m.slice(s.Addr, uint64(s.Length))
	if !ok {
		return nil, nil, false
	}
	m.acquire(q.stripe)
	return b, m, true
}
