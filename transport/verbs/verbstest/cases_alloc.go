package verbstest

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// allocCall is one call of a parent domain's allocator, as recordingAllocator saw it.
type allocCall struct {
	size, align int
	typ         verbs.ResourceType
	addr        uintptr // of what Alloc returned (0 for ErrUseDefault or an error)
}

// recordingAllocator is a custom allocator (verbs.Allocator) that records its calls and
// answers as told: memory of its own (Go memory, aligned by over-allocating: the ibv
// provider pins what it hands to C), ErrUseDefault, or a failure.
type recordingAllocator struct {
	answer error // nil: give memory; verbs.ErrUseDefault; anything else: fail

	mu     sync.Mutex
	allocs []allocCall
	frees  []allocCall
	live   map[uintptr][]byte
}

var errAllocTest = errors.New("verbstest: this allocator refuses")

func (a *recordingAllocator) Alloc(size, alignment int, typ verbs.ResourceType) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := allocCall{size: size, align: alignment, typ: typ}
	if a.answer != nil || size <= 0 || alignment <= 0 {
		a.allocs = append(a.allocs, c)
		if a.answer == nil {
			return nil, fmt.Errorf("verbstest: alloc of %d bytes aligned to %d", size, alignment)
		}
		return nil, a.answer
	}
	raw := make([]byte, size+alignment)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&raw[0])) % uintptr(alignment)); r != 0 {
		off = alignment - r
	}
	buf := raw[off : off+size : off+size]
	for i := range buf {
		buf[i] = 0xa5 // the provider zeroes what it uses
	}
	c.addr = uintptr(unsafe.Pointer(&buf[0]))
	a.allocs = append(a.allocs, c)
	if a.live == nil {
		a.live = map[uintptr][]byte{}
	}
	a.live[c.addr] = buf
	return buf, nil
}

func (a *recordingAllocator) Free(buf []byte, typ verbs.ResourceType) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := allocCall{size: len(buf), typ: typ}
	if len(buf) > 0 {
		c.addr = uintptr(unsafe.Pointer(&buf[0]))
	}
	a.frees = append(a.frees, c)
	delete(a.live, c.addr)
}

func (a *recordingAllocator) calls() (allocs, frees []allocCall, live int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]allocCall(nil), a.allocs...), append([]allocCall(nil), a.frees...), len(a.live)
}

// parentWith allocates a parent domain of h's PD, without a thread domain, with the
// custom allocator a, released at cleanup; it skips the case where the device has none.
func (h *host) parentWith(a verbs.Allocator) verbs.PD {
	h.e.t.Helper()
	pd, err := verbs.AllocParentDomain(h.dev, verbs.ParentDomainAttr{PD: h.pd, Allocator: a})
	if errors.Is(err, verbs.ErrUnsupported) {
		h.e.t.Skipf("%s has no parent domains: %v", h.dev.Name(), err)
	}
	if err != nil {
		h.e.Fatalf("%s: alloc parent domain with an allocator: %v", h.name, err)
	}
	h.track(rankParent, "parent domain", pd, pd.Dealloc)
	return pd
}

// pingParent checks that qc (on a parent domain) and qs carry a SEND each way.
func pingParent(e *env, c, s *host, qc, qs verbs.QP) {
	cbuf, sbuf := c.mr(4096, verbs.AccessLocalWrite), s.mr(4096, verbs.AccessLocalWrite)
	copy(sbuf.Bytes(), "to the allocator's QP")
	r := e.newWRID()
	e.postRecv(qc, verbs.RecvWR{WRID: r, SGL: []verbs.SGE{verbs.SGEFor(cbuf, 0, 64)}})
	w := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(sbuf, 0, 21)}}
	e.postSend(qs, w)
	e.checkWC("SEND to the parent domain's QP", e.poll1(s.scq, "S's SEND"), qs, w.WRID, verbs.WCSuccess, verbs.WCSend)
	if e.checkWC("receive on the parent domain's QP", e.poll1(c.rcq, "C's receive"), qc, r, verbs.WCSuccess, verbs.WCRecv) {
		e.wantBytes("message", cbuf.Bytes()[:21], []byte("to the allocator's QP"))
	}
	rs := e.newWRID()
	e.postRecv(qs, verbs.RecvWR{WRID: rs, SGL: []verbs.SGE{verbs.SGEFor(sbuf, 0, 64)}})
	copy(cbuf.Bytes()[1024:], "from the allocator's QP")
	w2 := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(cbuf, 1024, 23)}}
	e.postSend(qc, w2)
	e.checkWC("SEND from the parent domain's QP", e.poll1(c.scq, "C's SEND"), qc, w2.WRID, verbs.WCSuccess, verbs.WCSend)
	if e.checkWC("receive on S", e.poll1(s.rcq, "S's receive"), qs, rs, verbs.WCSuccess, verbs.WCRecv) {
		e.wantBytes("message back", sbuf.Bytes()[:23], []byte("from the allocator's QP"))
	}
}

// T4: a QP created on a parent domain with an allocator has the provider's buffers from
// it: every call names a size, a power-of-two alignment and a resource type, and what it
// returned is used (the QP carries messages both ways). The parent domain cannot be
// deallocated while the QP exists (EBUSY); destroying the QP gives every buffer back,
// each with the type it was asked for.
func caseT4(e *env) {
	c, s := e.newHost("C"), e.newHost("S")
	a := &recordingAllocator{}
	pdom := c.parentWith(a)
	qc := c.qp(qpOpt{pd: pdom})
	qs := s.qp(qpOpt{})
	allocs, _, _ := a.calls()
	if len(allocs) == 0 {
		e.Logf("%s asked the allocator for nothing when creating a QP (its buffers are all its own)", c.dev.Name())
	}
	for _, ac := range allocs {
		if ac.size <= 0 || ac.align <= 0 || ac.align&(ac.align-1) != 0 {
			e.Errorf("allocator called with size %d, alignment %d (type %d): want a positive size and a power-of-two alignment", ac.size, ac.align, ac.typ)
		}
	}
	e.connect(qc, cm.DefaultParams(), qs, cm.DefaultParams())
	pingParent(e, c, s, qc, qs)
	if err := c.free(pdom); !errors.Is(err, verbs.ErrBusy) {
		e.Errorf("dealloc of the parent domain with a QP on it: %v, want EBUSY", err)
	}
	if err := c.free(qc); err != nil {
		e.Fatalf("destroy QP: %v", err)
	}
	allocs, frees, live := a.calls()
	if live != 0 || len(frees) != len(allocs) {
		e.Errorf("after the QP was destroyed: %d allocs, %d frees, %d buffers not given back", len(allocs), len(frees), live)
	}
	types := map[uintptr]verbs.ResourceType{}
	for _, ac := range allocs {
		types[ac.addr] = ac.typ
	}
	for _, f := range frees {
		if t, ok := types[f.addr]; !ok || t != f.typ {
			e.Errorf("free of %#x with type %d: allocated with type %d (found %v)", f.addr, f.typ, t, ok)
		}
	}
	if err := c.free(pdom); err != nil {
		e.Errorf("dealloc of the parent domain without objects: %v", err)
	}
}

// T5: an allocator that answers IBV_ALLOCATOR_USE_DEFAULT (verbs.ErrUseDefault) has the
// provider allocate the buffer itself: the QP works, and nothing is given back to the
// allocator.
func caseT5(e *env) {
	c, s := e.newHost("C"), e.newHost("S")
	a := &recordingAllocator{answer: verbs.ErrUseDefault}
	pdom := c.parentWith(a)
	qc := c.qp(qpOpt{pd: pdom})
	qs := s.qp(qpOpt{})
	e.connect(qc, cm.DefaultParams(), qs, cm.DefaultParams())
	pingParent(e, c, s, qc, qs)
	if err := c.free(qc); err != nil {
		e.Fatalf("destroy QP: %v", err)
	}
	if _, frees, _ := a.calls(); len(frees) != 0 {
		e.Errorf("the allocator was given back %d buffers it never gave", len(frees))
	}
}

// T6: an allocator that fails fails the verb that needed it, with an error; nothing is
// left on the parent domain, which then deallocates.
func caseT6(e *env) {
	c := e.newHost("C")
	a := &recordingAllocator{answer: errAllocTest}
	pdom := c.parentWith(a)
	qp, err := pdom.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	allocs, _, _ := a.calls()
	if len(allocs) == 0 {
		if err == nil {
			c.track(rankQP, "QP", qp, qp.Destroy)
		}
		e.t.Skipf("%s asked the allocator for nothing when creating a QP: a failing allocator cannot fail it", c.dev.Name())
	}
	if err == nil {
		c.track(rankQP, "QP", qp, qp.Destroy)
		e.Fatalf("create QP with a failing allocator: succeeded, want an error")
	}
	e.Logf("create QP with a failing allocator: %v", err)
	if err := c.free(pdom); err != nil {
		e.Errorf("dealloc of the parent domain after the failed create: %v", err)
	}
}
