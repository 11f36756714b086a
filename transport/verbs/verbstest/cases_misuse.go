package verbstest

import (
	"fmt"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

func misuseCases() []testCase {
	return []testCase{
		{"M1", "post_in_reset_init", caseM1},
		{"M2", "send_queue_full", caseM2},
		{"M3", "recv_queue_full", caseM3},
		{"M4", "double_release", caseM4},
		{"M5", "regmr_not_mapped", caseM5},
		{"M6", "invalid_transition", caseM6},
		{"M7", "regmr_remote_write_without_local_write", caseM7},
		{"M8", "too_many_sges", caseM8},
	}
}

// M1: post_send on a QP in RESET or INIT fails with ErrInvalid; post_recv fails in RESET
// and is allowed from INIT on.
func caseM1(e *env) {
	h := e.newHost("A")
	buf := h.mr(4096, verbs.AccessLocalWrite)
	qp := h.qp(qpOpt{})
	send := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(buf, 0, 8)}}
	recv := verbs.RecvWR{WRID: 2, SGL: []verbs.SGE{verbs.SGEFor(buf, 64, 64)}}
	err := qp.PostSend([]verbs.SendWR{send})
	if e.errIs("post_send in RESET", err, verbs.ErrInvalid) {
		e.postErrIndex("post_send in RESET", err, 0)
	}
	err = qp.PostRecv([]verbs.RecvWR{recv})
	if e.errIs("post_recv in RESET", err, verbs.ErrInvalid) {
		e.postErrIndex("post_recv in RESET", err, 0)
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPStateInit, Access: rr}); err != nil {
		e.Fatalf("RESET -> INIT: %v", err)
	}
	e.wantState(qp, verbs.QPStateInit, "QP")
	e.errIs("post_send in INIT", qp.PostSend([]verbs.SendWR{send}), verbs.ErrInvalid)
	if err := qp.PostRecv([]verbs.RecvWR{recv}); err != nil {
		e.Errorf("post_recv in INIT: %v, want it queued", err)
	}
	e.expectNoWC(h.scq, quiet, "send CQ")
	e.expectNoWC(h.rcq, quiet, "receive CQ")
}

// M2: posting beyond max_send_wr fails with ErrQueueFull, naming the first request that
// did not fit. The queue here is held full by a SEND waiting (RNR) for a receive; once
// receives are posted everything completes and the queue takes requests again.
func caseM2(e *env) {
	r := e.newRig(rigOpt{scap: verbs.QPCap{MaxSendWR: 8}})
	n := r.qs.Cap().MaxSendWR
	e.Logf("S's QP: max_send_wr %d", n)
	wrs := make([]verbs.SendWR, n+1)
	for i := range wrs {
		wrs[i] = r.sWR(verbs.WRSend, []byte(fmt.Sprintf("send %d", i)))
	}
	err := r.qs.PostSend(wrs)
	if e.errIs(fmt.Sprintf("post of %d SENDs on a queue of %d", n+1, n), err, verbs.ErrQueueFull) {
		e.postErrIndex("post beyond max_send_wr", err, n)
	}
	e.expectNoWC(r.s.scq, quiet, "S's send CQ (C has no receive)")
	err = r.qs.PostSend(wrs[n:])
	if e.errIs("post on a full send queue", err, verbs.ErrQueueFull) {
		e.postErrIndex("post on a full send queue", err, 0)
	}
	rvs := make([]recv, n)
	for i := range rvs {
		rvs[i] = r.recvC(64)
	}
	wcs := e.pollN(r.s.scq, n, "the queued SENDs")
	rcs := e.pollN(r.c.rcq, n, "C's receives")
	for i := range n {
		e.checkWC(fmt.Sprintf("SEND %d", i), wcs[i], r.qs, wrs[i].WRID, verbs.WCSuccess, verbs.WCSend)
		e.checkWC(fmt.Sprintf("receive %d", i), rcs[i], r.qc, rvs[i].wrid, verbs.WCSuccess, verbs.WCRecv)
	}
	rv := r.recvC(64)
	e.postSend(r.qs, wrs[n])
	e.checkWC("SEND after the queue drained", e.poll1(r.s.scq, "SEND"), r.qs, wrs[n].WRID, verbs.WCSuccess, verbs.WCSend)
	e.checkWC("its receive", e.poll1(r.c.rcq, "receive"), r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv)
}

// M3: posting beyond max_recv_wr fails with ErrQueueFull, naming the first request that
// did not fit; a receive consumed by a SEND frees its slot.
func caseM3(e *env) {
	r := e.newRig(rigOpt{ccap: verbs.QPCap{MaxRecvWR: 8}})
	n := r.qc.Cap().MaxRecvWR
	e.Logf("C's QP: max_recv_wr %d", n)
	wrs := make([]verbs.RecvWR, n+1)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{WRID: e.newWRID(), SGL: []verbs.SGE{verbs.SGEFor(r.cmsg, r.cRecvSlot(64), 64)}}
	}
	err := r.qc.PostRecv(wrs)
	if e.errIs(fmt.Sprintf("post of %d receives on a queue of %d", n+1, n), err, verbs.ErrQueueFull) {
		e.postErrIndex("post beyond max_recv_wr", err, n)
	}
	sw := r.sWR(verbs.WRSend, []byte("take one"))
	e.postSend(r.qs, sw)
	e.checkWC("SEND", e.poll1(r.s.scq, "SEND"), r.qs, sw.WRID, verbs.WCSuccess, verbs.WCSend)
	e.checkWC("first receive", e.poll1(r.c.rcq, "receive"), r.qc, wrs[0].WRID, verbs.WCSuccess, verbs.WCRecv)
	if err := r.qc.PostRecv(wrs[n:]); err != nil {
		e.Errorf("post_recv after a receive completed: %v, want it queued", err)
	}
}

// M4: releasing an object twice fails with ErrClosed the second time.
func caseM4(e *env) {
	h := e.newHost("A")
	twice := func(what string, obj any, release func() error) {
		e.t.Helper()
		if err := h.free(obj); err != nil {
			e.Errorf("%s: first release: %v", what, err)
			return
		}
		e.errIs(what+": second release", release(), verbs.ErrClosed)
	}
	mw2 := h.mw(verbs.MWType2)
	twice("type-2 MW Dealloc", mw2, mw2.Dealloc)
	mw1 := h.mw(verbs.MWType1)
	twice("type-1 MW Dealloc", mw1, mw1.Dealloc)
	mr := h.mr(4096, verbs.AccessLocalWrite)
	twice("MR Dereg", mr, mr.Dereg)
	qp := h.qp(qpOpt{})
	twice("QP Destroy", qp, qp.Destroy)
	cq := h.newCQ(16)
	twice("CQ Destroy", cq, cq.Destroy)
	pd := h.newPD()
	twice("PD Dealloc", pd, pd.Dealloc)
	mem := h.mapMem(4096)
	twice("Memory Unmap", mem, mem.Unmap)
	d := e.f.Open(e.t)
	if err := d.Close(); err != nil {
		e.Errorf("Device Close: %v", err)
	} else {
		e.errIs("Device Close: second close", d.Close(), verbs.ErrClosed)
	}
}

// M5: RegMR refuses Go heap memory with ErrNotMapped; a mapping with a region registered
// over it cannot be unmapped (ErrBusy) until the region is deregistered.
func caseM5(e *env) {
	h := e.newHost("A")
	heap := make([]byte, 8192)
	mr, err := h.pd.RegMR(heap, verbs.AccessLocalWrite)
	if err == nil {
		h.track(rankMR, "MR over the Go heap", mr, mr.Dereg)
	}
	e.errIs("RegMR of a Go heap slice", err, verbs.ErrNotMapped)
	mem := h.mapMem(8192)
	sub, err := h.pd.RegMR(mem.Bytes()[4096:], verbs.AccessLocalWrite)
	if err != nil {
		e.Fatalf("RegMR of the second page of a mapping: %v", err)
	}
	h.track(rankMR, "MR over part of a mapping", sub, sub.Dereg)
	e.errIs("Unmap with a region registered", mem.Unmap(), verbs.ErrBusy)
	if err := h.free(sub); err != nil {
		e.Errorf("Dereg: %v", err)
	}
	if err := h.free(mem); err != nil {
		e.Errorf("Unmap after Dereg: %v", err)
	}
}

// M6: only RESET->INIT->RTR->RTS, any->ERR and any->RESET are allowed; other transitions
// fail with ErrInvalid and leave the state as it was.
func caseM6(e *env) {
	h := e.newHost("A")
	qp := h.qp(qpOpt{})
	bad := func(to verbs.QPState) {
		e.t.Helper()
		from := qp.State()
		e.errIs(fmt.Sprintf("Modify %v -> %v", from, to), qp.Modify(verbs.QPAttr{State: to, Access: rr}), verbs.ErrInvalid)
		e.wantState(qp, from, fmt.Sprintf("after the refused %v -> %v", from, to))
	}
	good := func(to verbs.QPState) {
		e.t.Helper()
		from := qp.State()
		if err := qp.Modify(verbs.QPAttr{State: to, Access: rr}); err != nil {
			e.Errorf("Modify %v -> %v: %v", from, to, err)
		}
		e.wantState(qp, to, fmt.Sprintf("after %v -> %v", from, to))
	}
	bad(verbs.QPStateRTS)
	bad(verbs.QPStateRTR)
	good(verbs.QPStateInit)
	bad(verbs.QPStateRTS)
	good(verbs.QPStateError)
	bad(verbs.QPStateRTS)
	bad(verbs.QPStateInit)
	good(verbs.QPStateReset)
	good(verbs.QPStateInit)
	good(verbs.QPStateReset)
	bad(verbs.QPState(42))
}

// M7: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (ErrInvalid otherwise).
func caseM7(e *env) {
	h := e.newHost("A")
	mem := h.mapMem(4096)
	for _, a := range []verbs.Access{verbs.AccessRemoteWrite, verbs.AccessRemoteAtomic, verbs.AccessRemoteWrite | verbs.AccessRemoteRead} {
		mr, err := h.pd.RegMR(mem.Bytes(), a)
		if err == nil {
			h.track(rankMR, "MR "+a.String(), mr, mr.Dereg)
		}
		e.errIs(fmt.Sprintf("RegMR with %v", a), err, verbs.ErrInvalid)
	}
	mr, err := h.pd.RegMR(mem.Bytes(), verbs.AccessRemoteWrite|verbs.AccessLocalWrite)
	if err != nil {
		e.Errorf("RegMR with REMOTE_WRITE|LOCAL_WRITE: %v", err)
	} else {
		h.track(rankMR, "MR", mr, mr.Dereg)
	}
}

// M8: a work request with more SGEs than the QP's max_send_sge / max_recv_sge is refused
// at post time with ErrInvalid.
func caseM8(e *env) {
	r := e.newRig(rigOpt{})
	ns, nr := r.qs.Cap().MaxSendSGE, r.qc.Cap().MaxRecvSGE
	sgl := make([]verbs.SGE, max(ns, nr)+1)
	for i := range sgl {
		sgl[i] = verbs.SGEFor(r.smsg, i*8, 8)
	}
	wr := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: sgl[:ns+1]}
	e.errIs(fmt.Sprintf("SEND with %d SGEs (max_send_sge %d)", ns+1, ns), postOne(e, r.qs, wr), verbs.ErrInvalid)
	rsgl := make([]verbs.SGE, nr+1)
	for i := range rsgl {
		rsgl[i] = verbs.SGEFor(r.cmsg, i*8, 8)
	}
	err := r.qc.PostRecv([]verbs.RecvWR{{WRID: e.newWRID(), SGL: rsgl}})
	if e.errIs(fmt.Sprintf("receive with %d SGEs (max_recv_sge %d)", nr+1, nr), err, verbs.ErrInvalid) {
		e.postErrIndex("receive with too many SGEs", err, 0)
	}
	e.wantState(r.qs, verbs.QPStateRTS, "S's QP")
	e.wantState(r.qc, verbs.QPStateRTS, "C's QP")
	e.expectNoWC(r.s.scq, quiet, "S's send CQ")
}
