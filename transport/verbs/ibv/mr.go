//go:build ibverbs && linux && cgo

package ibv

/*
#include "mwibv.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// pd is a protection domain (ibv_pd).
type pd struct {
	dev   *Device
	c     *C.struct_ibv_pd
	users verbs.Users // MRs, MWs, QPs and SRQs

	// A parent domain (domains.go) is a pd too: libibverbs takes its ibv_pd wherever a
	// PD goes. root and td are what it holds busy; nil for a plain PD.
	root  *pd
	td    *td
	alloc *parentAlloc // the parent domain's custom allocator, or nil
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (verbs.PD, error) {
	if err := d.use(); err != nil {
		return nil, err
	}
	c, err := C.ibv_alloc_pd(d.ctx)
	if c == nil {
		d.unuse()
		return nil, errnoErr(d.name+": alloc PD", cErr(err))
	}
	return &pd{dev: d, c: c}, nil
}

func (p *pd) use() error { return p.users.Acquire("ibv: PD") }
func (p *pd) unuse()     { p.users.Release() }

func (p *pd) Dealloc() error {
	err := p.users.Close("ibv: dealloc PD", "MRs, MWs, QPs or SRQs", func() error {
		if rc := C.ibv_dealloc_pd(p.c); rc != 0 { // a parent domain's too
			return errnoErr("dealloc PD", syscall.Errno(rc))
		}
		if p.root != nil {
			p.root.unuse()
		}
		if p.td != nil {
			p.td.users.Release()
		}
		p.alloc.close()
		return nil
	})
	if err != nil {
		return err
	}
	p.dev.unuse()
	return nil
}

// mr is a registered memory region (ibv_mr) over memory from verbs.Map.
type mr struct {
	pd     *pd
	mem    *verbs.Memory
	buf    []byte
	addr   uint64
	access verbs.Access
	lkey   uint32
	rkey   uint32

	mu sync.Mutex
	c  *C.struct_ibv_mr // nil once deregistered
}

const knownAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead |
	verbs.AccessRemoteAtomic | verbs.AccessMWBind | verbs.AccessZeroBased

// RegMR registers buf, which must lie in memory from verbs.Map, with ibv_reg_mr (or, for
// AccessZeroBased, ibv_reg_mr_iova with iova 0: remote and local addresses are offsets).
func (p *pd) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if access&(verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 && access&verbs.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("ibv: reg MR: %v requires LOCAL_WRITE: %w", access, verbs.ErrInvalid)
	}
	if access&^knownAccess != 0 {
		return nil, fmt.Errorf("ibv: reg MR: unknown access flags %v: %w", access, verbs.ErrInvalid)
	}
	if err := p.use(); err != nil {
		return nil, err
	}
	mem, err := verbs.Pin(buf)
	if err != nil {
		p.unuse()
		return nil, err
	}
	addr := verbs.AddrOf(buf)
	zb := C.int(0)
	if access&verbs.AccessZeroBased != 0 {
		zb = 1
	}
	kaccess := C.int(access &^ verbs.AccessZeroBased)
	c, cerr := C.mwibv_reg_mr(p.c, C.uintptr_t(addr), C.size_t(len(buf)), kaccess, zb)
	if c == nil {
		mem.Unpin()
		p.unuse()
		return nil, errnoErr(fmt.Sprintf("reg MR of %d bytes %v", len(buf), access), cErr(cerr))
	}
	return &mr{pd: p, mem: mem, buf: buf, addr: addr, access: access, lkey: uint32(c.lkey), rkey: uint32(c.rkey), c: c}, nil
}

func (m *mr) LKey() uint32         { return m.lkey }
func (m *mr) RKey() uint32         { return m.rkey }
func (m *mr) Addr() uint64         { return m.addr }
func (m *mr) Bytes() []byte        { return m.buf }
func (m *mr) Access() verbs.Access { return m.access }

// Dereg deregisters the region. libibverbs refuses (EINVAL) while a window is bound to it,
// which is reported as verbs.ErrBusy.
func (m *mr) Dereg() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return fmt.Errorf("ibv: dereg MR 0x%x: %w", m.lkey, verbs.ErrClosed)
	}
	if rc := C.ibv_dereg_mr(m.c); rc != 0 {
		e := syscall.Errno(rc)
		if e == syscall.EINVAL {
			return fmt.Errorf("ibv: dereg MR 0x%x: memory windows are bound to it (invalidate or dealloc them first): %w: %w", m.lkey, verbs.ErrBusy, e)
		}
		return errnoErr(fmt.Sprintf("dereg MR 0x%x", m.lkey), e)
	}
	m.c = nil
	m.mem.Unpin()
	m.pd.unuse()
	return nil
}

// cptr returns the region's ibv_mr, or nil once deregistered.
func (m *mr) cptr() *C.struct_ibv_mr {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c
}

// mw is a memory window (ibv_mw).
//
// libibverbs' ibv_mw.rkey is the key the provider presents as the window's current one when
// it binds (rxe checks it against the kernel's). The provider keeps it in step with the
// binds posted: ibv_bind_mw advances it for type 1, and PostSend advances it for each
// BIND_MW whose new rkey names this window. MW.RKey() of a type-2 window stays the
// allocation key, as in libibverbs, where the owner tracks the rkeys it binds.
type mw struct {
	pd  *pd
	typ verbs.MWType

	mu       sync.Mutex
	c        *C.struct_ibv_mw // nil once deallocated
	allocKey uint32
	boundQP  *qp  // type 2: the QP of the last bind posted, until known to be unbound
	lost     bool // release could not reallocate the window; Dealloc has only to count it
}

// AllocMW allocates a window of type 1 or 2 (ibv_alloc_mw).
func (p *pd) AllocMW(t verbs.MWType) (verbs.MW, error) {
	if t != verbs.MWType1 && t != verbs.MWType2 {
		return nil, fmt.Errorf("ibv: alloc MW of unknown %v: %w", t, verbs.ErrInvalid)
	}
	if err := p.use(); err != nil {
		return nil, err
	}
	c, err := allocMW(p, t)
	if err != nil {
		p.unuse()
		return nil, err
	}
	w := &mw{pd: p, typ: t, c: c, allocKey: uint32(c.rkey)}
	d := p.dev
	d.mu.Lock()
	d.mws[verbs.KeyIndex(w.allocKey)] = w
	d.mu.Unlock()
	return w, nil
}

func allocMW(p *pd, t verbs.MWType) (*C.struct_ibv_mw, error) {
	ct := C.enum_ibv_mw_type(C.IBV_MW_TYPE_1)
	if t == verbs.MWType2 {
		ct = C.IBV_MW_TYPE_2
	}
	c, err := C.ibv_alloc_mw(p.c, ct)
	if c == nil {
		return nil, errnoErr(fmt.Sprintf("alloc %v MW", t), cErr(err))
	}
	return c, nil
}

func (w *mw) Type() verbs.MWType { return w.typ }

// RKey returns the allocation key of a type-2 window, and the current key of a type-1
// window (the key of its last Bind).
func (w *mw) RKey() uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.typ == verbs.MWType1 && w.c != nil {
		return uint32(w.c.rkey)
	}
	return w.allocKey
}

// Bind binds a type-1 window through qp with ibv_bind_mw and returns its new rkey.
func (w *mw) Bind(qpi verbs.QP, wrid uint64, flags verbs.SendFlags, b verbs.MWBind) (uint32, error) {
	if w.typ != verbs.MWType1 {
		return 0, fmt.Errorf("ibv: MW.Bind on a %v window (type 2 binds with a BIND_MW work request): %w", w.typ, verbs.ErrInvalid)
	}
	if b.Access&verbs.AccessZeroBased != 0 {
		return 0, fmt.Errorf("ibv: MW.Bind: a type-1 window cannot be zero-based: %w", verbs.ErrInvalid)
	}
	q, ok := qpi.(*qp)
	if !ok || q == nil {
		return 0, fmt.Errorf("ibv: MW.Bind through a QP of another provider: %w", verbs.ErrInvalid)
	}
	m, ok := b.MR.(*mr)
	if !ok || m == nil {
		return 0, fmt.Errorf("ibv: MW.Bind over a region of another provider: %w", verbs.ErrInvalid)
	}
	return q.bindType1(w, m, wrid, flags, b)
}

// Dealloc releases the window (ibv_dealloc_mw), invalidating it if bound.
func (w *mw) Dealloc() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c == nil {
		if w.lost {
			w.lost = false
			w.pd.unuse()
			return nil
		}
		return fmt.Errorf("ibv: dealloc MW 0x%x: %w", w.allocKey, verbs.ErrClosed)
	}
	idx := verbs.KeyIndex(uint32(w.c.rkey))
	if rc := C.ibv_dealloc_mw(w.c); rc != 0 {
		return errnoErr(fmt.Sprintf("dealloc MW 0x%x", w.allocKey), syscall.Errno(rc))
	}
	w.c = nil
	w.boundQP = nil
	d := w.pd.dev
	d.mu.Lock()
	if d.mws[idx] == w {
		delete(d.mws, idx)
	}
	d.mu.Unlock()
	w.pd.unuse()
	return nil
}

// release frees the window's binding to q before q is destroyed: rxe keeps a QP with a
// type-2 window bound to it alive (the window holds a reference to it), so destroying it
// would block in the kernel and leave the window pointing at a freed QP. The window is
// reallocated, which unbinds it; its RKey() is the new allocation key afterwards. It
// reports whether the old window is gone (the QP may then be destroyed) and why a step
// failed. w.mu is held.
func (w *mw) release() (gone bool, err error) {
	old := w.c
	idx := verbs.KeyIndex(uint32(old.rkey))
	if rc := C.ibv_dealloc_mw(old); rc != 0 {
		return false, errnoErr(fmt.Sprintf("release MW 0x%x from its QP", w.allocKey), syscall.Errno(rc))
	}
	w.boundQP = nil
	d := w.pd.dev
	c, err := allocMW(w.pd, w.typ)
	d.mu.Lock()
	if d.mws[idx] == w {
		delete(d.mws, idx)
	}
	if err == nil {
		w.c = c
		w.allocKey = uint32(c.rkey)
		d.mws[verbs.KeyIndex(w.allocKey)] = w
	}
	d.mu.Unlock()
	if err != nil {
		// The window is gone: a later Dealloc only releases the PD's count.
		w.c, w.lost = nil, true
		return true, fmt.Errorf("ibv: reallocate MW released from its QP: %w", err)
	}
	return true, nil
}
