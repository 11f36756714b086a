package verbstest

import (
	"errors"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)). A
// device without them (verbs.ErrUnsupported) skips these cases, saying so.
func domainCases() []testCase {
	return []testCase{
		{"T1", "parent_domain_in_place_of_pd", caseT1},
		{"T2", "parent_domain_dealloc_busy", caseT2},
		{"T3", "parent_domain_needs_pd", caseT3},
		{"T4", "allocator_called_with_size_alignment_type", caseT4},
		{"T5", "allocator_use_default", caseT5},
		{"T6", "allocator_failure_fails_the_verb", caseT6},
	}
}

// domains allocates a thread domain and a parent domain of h's PD carrying it, released
// at cleanup; it skips the case where the device has none.
func (h *host) domains() (verbs.TD, verbs.PD) {
	h.e.t.Helper()
	td, err := verbs.AllocTD(h.dev)
	if errors.Is(err, verbs.ErrUnsupported) {
		h.e.t.Skipf("%s has no thread domains: %v", h.dev.Name(), err)
	}
	if err != nil {
		h.e.Fatalf("%s: alloc TD: %v", h.name, err)
	}
	h.track(rankTD, "TD", td, td.Dealloc)
	pd, err := verbs.AllocParentDomain(h.dev, verbs.ParentDomainAttr{PD: h.pd, TD: td})
	if errors.Is(err, verbs.ErrUnsupported) {
		h.e.t.Skipf("%s has thread domains but no parent domains: %v", h.dev.Name(), err)
	}
	if err != nil {
		h.e.Fatalf("%s: alloc parent domain: %v", h.name, err)
	}
	h.track(rankParent, "parent domain", pd, pd.Dealloc)
	return td, pd
}

// T1: a parent domain is accepted wherever a PD is: a QP and an MR created on it carry
// messages both ways, and the QP uses an MR of the parent's PD as well (one protection
// domain).
func caseT1(e *env) {
	c, s := e.newHost("C"), e.newHost("S")
	_, pdom := c.domains()
	qc := c.qp(qpOpt{pd: pdom})
	qs := s.qp(qpOpt{})
	e.connect(qc, cm.DefaultParams(), qs, cm.DefaultParams())
	onParent := c.mrOn(pdom, 4096, verbs.AccessLocalWrite)
	onPD := c.mr(4096, verbs.AccessLocalWrite)
	sbuf := s.mr(4096, verbs.AccessLocalWrite)
	copy(sbuf.Bytes(), "to the parent domain's MR")
	copy(sbuf.Bytes()[2048:], "to the PD's MR")
	r1, r2 := e.newWRID(), e.newWRID()
	e.postRecv(qc, verbs.RecvWR{WRID: r1, SGL: []verbs.SGE{verbs.SGEFor(onParent, 0, 64)}},
		verbs.RecvWR{WRID: r2, SGL: []verbs.SGE{verbs.SGEFor(onPD, 0, 64)}})
	w1 := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(sbuf, 0, 25)}}
	w2 := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(sbuf, 2048, 14)}}
	e.postSend(qs, w1, w2)
	sent := e.pollN(s.scq, 2, "S's SENDs")
	e.checkWC("SEND 1", sent[0], qs, w1.WRID, verbs.WCSuccess, verbs.WCSend)
	e.checkWC("SEND 2", sent[1], qs, w2.WRID, verbs.WCSuccess, verbs.WCSend)
	got := e.pollN(c.rcq, 2, "receives on the parent domain's QP")
	if e.checkWC("receive into the parent domain's MR", got[0], qc, r1, verbs.WCSuccess, verbs.WCRecv) {
		e.wantBytes("message 1", onParent.Bytes()[:25], []byte("to the parent domain's MR"))
	}
	if e.checkWC("receive into the PD's MR", got[1], qc, r2, verbs.WCSuccess, verbs.WCRecv) {
		e.wantBytes("message 2", onPD.Bytes()[:14], []byte("to the PD's MR"))
	}
	// And back: a SEND from the parent domain's MR.
	rs := e.newWRID()
	e.postRecv(qs, verbs.RecvWR{WRID: rs, SGL: []verbs.SGE{verbs.SGEFor(sbuf, 0, 64)}})
	w3 := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(onParent, 0, 25)}}
	e.postSend(qc, w3)
	e.checkWC("SEND from the parent domain", e.poll1(c.scq, "C's SEND"), qc, w3.WRID, verbs.WCSuccess, verbs.WCSend)
	if e.checkWC("receive on S", e.poll1(s.rcq, "S's receive"), qs, rs, verbs.WCSuccess, verbs.WCRecv) {
		e.wantBytes("message 3", sbuf.Bytes()[:25], []byte("to the parent domain's MR"))
	}
}

// T2: deallocating a parent domain that still has a QP fails (EBUSY), as do its thread
// domain and its PD while it exists; once the QP is destroyed, the parent domain, then the
// thread domain, are released.
func caseT2(e *env) {
	c := e.newHost("C")
	td, pdom := c.domains()
	qp := c.qp(qpOpt{pd: pdom})
	for _, tc := range []struct {
		what string
		obj  any
	}{{"the parent domain (a QP on it)", pdom}, {"the thread domain (a parent domain carries it)", td}, {"the PD (a parent domain of it)", c.pd}} {
		if err := c.free(tc.obj); !errors.Is(err, verbs.ErrBusy) {
			e.Errorf("dealloc of %s: %v, want EBUSY", tc.what, err)
		}
	}
	if err := c.free(qp); err != nil {
		e.Fatalf("destroy QP: %v", err)
	}
	if err := c.free(pdom); err != nil {
		e.Errorf("dealloc of the parent domain without objects: %v", err)
	}
	if err := c.free(td); err != nil {
		e.Errorf("dealloc of the thread domain without parent domains: %v", err)
	}
}

// T3: a parent domain needs a PD (ibv_parent_domain_init_attr.pd "can't be NULL").
func caseT3(e *env) {
	c := e.newHost("C")
	td, _ := c.domains()
	if _, err := verbs.AllocParentDomain(c.dev, verbs.ParentDomainAttr{TD: td}); !errors.Is(err, verbs.ErrInvalid) {
		e.Errorf("alloc parent domain without a PD: %v, want EINVAL", err)
	}
}
