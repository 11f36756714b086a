package verbstest

import (
	"fmt"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

func srqCases() []testCase {
	return []testCase{
		{"Q1", "srq_two_peers_post_order", caseQ1},
		{"Q2a", "srq_empty_rnr_retry_exceeded", caseQ2a},
		{"Q2b", "srq_empty_rnr_late_receive", caseQ2b},
		{"Q3", "srq_qp_post_recv_refused", caseQ3},
		{"Q4a", "srq_qp_destroyed_keeps_receives", func(e *env) { caseQ4(e, true) }},
		{"Q4b", "srq_qp_error_keeps_receives", func(e *env) { caseQ4(e, false) }},
		{"Q5", "srq_destroy_busy", caseQ5},
		{"Q6", "srq_send_with_inv", caseQ6},
		{"Q7", "srq_limit", caseQ7},
	}
}

// srqMsg is the size of the messages and receives of the SRQ cases.
const srqMsg = 64

// srqRig is a server C with one SRQ and one QP on it per peer, each peer a host of its own
// with one QP connected to C's.
type srqRig struct {
	e     *env
	c     *host
	srq   verbs.SRQ
	rbuf  verbs.MR // C's receive buffers: receive i at i*srqMsg
	next  int      // the next receive buffer
	qc    []verbs.QP
	peers []*host
	qp    []verbs.QP // the peers' QPs: qp[i] is connected to qc[i]
	sbuf  []verbs.MR // the peers' send buffers
}

// newSRQRig connects n peers to C, whose QPs share one SRQ of depth depth. p, if not nil,
// are the connection parameters of every QP.
func (e *env) newSRQRig(n, depth int, p *cm.Params) *srqRig {
	e.t.Helper()
	params := cm.DefaultParams()
	if p != nil {
		params = *p
	}
	r := &srqRig{e: e, c: e.newHost("C")}
	r.srq = r.c.srq(verbs.SRQAttr{MaxWR: depth, MaxSGE: 1})
	r.rbuf = r.c.mr(256*srqMsg, verbs.AccessLocalWrite)
	for i := 0; i < n; i++ {
		h := e.newHost(fmt.Sprintf("P%d", i+1))
		qc := r.c.qp(qpOpt{srq: r.srq})
		qp := h.qp(qpOpt{})
		e.connect(qc, params, qp, params)
		r.qc, r.peers, r.qp = append(r.qc, qc), append(r.peers, h), append(r.qp, qp)
		r.sbuf = append(r.sbuf, h.mr(64*srqMsg, verbs.AccessLocalWrite))
	}
	return r
}

// post posts k receives to the SRQ, in order, each in a buffer of its own.
func (r *srqRig) post(k int) []recv {
	r.e.t.Helper()
	vs := make([]recv, k)
	wrs := make([]verbs.RecvWR, k)
	for i := range vs {
		off := (r.next % 256) * srqMsg
		r.next++
		vs[i] = recv{wrid: r.e.newWRID(), mr: r.rbuf, off: off, n: srqMsg}
		clear(vs[i].bytes())
		wrs[i] = verbs.RecvWR{WRID: vs[i].wrid, SGL: []verbs.SGE{verbs.SGEFor(r.rbuf, off, srqMsg)}}
	}
	r.e.postSRQRecv(r.srq, wrs...)
	return vs
}

// msg is the payload of message m from peer p: distinct for each, srqMsg bytes.
func srqPayload(p, m int) []byte {
	b := make([]byte, srqMsg)
	fillPattern(b, 100*p+m)
	copy(b, fmt.Sprintf("peer %d message %d.", p, m))
	return b
}

// send posts message m of peer p as a signaled SEND and returns the request.
func (r *srqRig) send(p, m int) verbs.SendWR {
	r.e.t.Helper()
	off := (m % 64) * srqMsg
	wr := verbs.SendWR{WRID: r.e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEFor(r.sbuf[p], off, srqMsg)}}
	copy(r.sbuf[p].Bytes()[off:], srqPayload(p, m))
	r.e.postSend(r.qp[p], wr)
	return wr
}

// sent waits for the completion of the SEND wr of peer p.
func (r *srqRig) sent(p int, wr verbs.SendWR) {
	r.e.t.Helper()
	wc := r.e.poll1(r.peers[p].scq, fmt.Sprintf("peer %d's SEND", p))
	r.e.checkWC(fmt.Sprintf("peer %d's SEND", p), wc, r.qp[p], wr.WRID, verbs.WCSuccess, verbs.WCSend)
}

// received checks C's completion wc: a receive of message m of peer p, through C's QP of
// that peer, into receive v.
func (r *srqRig) received(wc verbs.WorkCompletion, p, m int, v recv) {
	r.e.t.Helper()
	what := fmt.Sprintf("receive of peer %d's message %d", p, m)
	if !r.e.checkWC(what, wc, r.qc[p], v.wrid, verbs.WCSuccess, verbs.WCRecv) {
		return
	}
	if wc.ByteLen != srqMsg {
		r.e.Errorf("%s: byte_len %d, want %d", what, wc.ByteLen, srqMsg)
	}
	r.e.wantBytes(what, v.bytes(), srqPayload(p, m))
}

// peerOf returns the index of C's QP numbered qpn, or -1.
func (r *srqRig) peerOf(qpn uint32) int {
	for i, q := range r.qc {
		if q.Num() == qpn {
			return i
		}
	}
	return -1
}

// Q1: two QPs on one SRQ, each connected to a peer of its own. SENDs from the peers one
// at a time take the SRQ's receives in post order, whichever QP they come through, and
// each completion names the QP; SENDs from both at once take the next receives, each QP's
// in the order its peer sent them, and each buffer holds the message its completion says.
func caseQ1(e *env) {
	r := e.newSRQRig(2, 32, nil)
	vs := r.post(12)
	// One at a time: P1, P2, P2, P1, P1, P2.
	order := []int{0, 1, 1, 0, 0, 1}
	count := make([]int, 2)
	for i, p := range order {
		wr := r.send(p, count[p])
		wc := e.poll1(r.c.rcq, fmt.Sprintf("C's receive %d", i))
		r.received(wc, p, count[p], vs[i])
		r.sent(p, wr)
		count[p]++
	}
	// Both at once: three SENDs each, posted back to back.
	var wrs [2][]verbs.SendWR
	for k := 0; k < 3; k++ {
		for p := 0; p < 2; p++ {
			wrs[p] = append(wrs[p], r.send(p, count[p]+k))
		}
	}
	wcs := e.pollN(r.c.rcq, 6, "C's receives of the six SENDs sent at once")
	byWRID := make(map[uint64]recv)
	for _, v := range vs[6:] {
		byWRID[v.wrid] = v
	}
	var last [2]uint64
	for _, wc := range wcs {
		p := r.peerOf(wc.QPNum)
		v, ok := byWRID[wc.WRID]
		switch {
		case p < 0:
			e.Errorf("receive %v names none of C's QPs (%d, %d)", wc, r.qc[0].Num(), r.qc[1].Num())
			continue
		case !ok:
			e.Errorf("receive %v: its WRID is not one of the six receives posted after the first six were used", wc)
			continue
		case wc.WRID <= last[p]:
			e.Errorf("receive %v: QP %d took receive %d after %d: an SRQ hands out its receives in post order", wc, wc.QPNum, wc.WRID, last[p])
		}
		delete(byWRID, wc.WRID)
		last[p] = wc.WRID
		r.received(wc, p, count[p], v)
		count[p]++
	}
	for p := 0; p < 2; p++ {
		got := e.pollN(r.peers[p].scq, 3, fmt.Sprintf("peer %d's three SENDs", p))
		for k, wc := range got {
			e.checkWC(fmt.Sprintf("peer %d's SEND %d", p, k), wc, r.qp[p], wrs[p][k].WRID, verbs.WCSuccess, verbs.WCSend)
		}
	}
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ after twelve receives were used")
}

// Q2a: a SEND arriving on a QP whose SRQ is empty is answered with RNR NAKs, as with an
// empty receive queue of its own; with RNRRetry 1 it completes RNR_RETRY_EXC_ERR.
func caseQ2a(e *env) {
	p := cm.DefaultParams()
	p.RNRRetry, p.MinRNRTimer = 1, time.Millisecond
	r := e.newSRQRig(2, 8, &p)
	wr := r.send(0, 0)
	wc := e.poll1(r.peers[0].scq, "SEND to a QP whose SRQ is empty")
	e.checkWC("SEND to a QP whose SRQ is empty, RNRRetry 1", wc, r.qp[0], wr.WRID, verbs.WCRNRRetryExcErr, 0)
	e.waitState(r.qp[0], verbs.QPStateError, "P1's QP after RNR_RETRY_EXC_ERR")
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ (nothing was posted)")
	// The other QP on the SRQ is untouched: a receive posted now serves its peer.
	vs := r.post(1)
	wr = r.send(1, 0)
	r.received(e.poll1(r.c.rcq, "C's receive through the other QP"), 1, 0, vs[0])
	r.sent(1, wr)
}

// Q2b: with RNRRetry 7 (infinite) a SEND to a QP whose SRQ is empty waits, and succeeds
// once a receive is posted to the SRQ.
func caseQ2b(e *env) {
	r := e.newSRQRig(2, 8, nil)
	wr := r.send(1, 0)
	e.expectNoWC(r.peers[1].scq, quiet, "P2's send CQ while C's SRQ is empty")
	vs := r.post(1)
	r.received(e.poll1(r.c.rcq, "C's late receive"), 1, 0, vs[0])
	r.sent(1, wr)
	e.wantState(r.qp[1], verbs.QPStateRTS, "P2's QP")
}

// Q3: a QP on an SRQ has no receive queue: PostRecv on it fails with ErrInvalid, in any
// state, and posts nothing. The SRQ's own checks: more SGEs than its MaxSGE is ErrInvalid,
// more receives than its capacity ErrQueueFull. A QP cannot take an SRQ of another PD.
func caseQ3(e *env) {
	r := e.newSRQRig(1, 8, nil)
	rv := verbs.RecvWR{WRID: e.newWRID(), SGL: []verbs.SGE{verbs.SGEFor(r.rbuf, 0, srqMsg)}}
	err := r.qc[0].PostRecv([]verbs.RecvWR{rv})
	if e.errIs("PostRecv on a connected QP that takes its receives from an SRQ", err, verbs.ErrInvalid) {
		e.postErrIndex("PostRecv on an SRQ's QP", err, 0)
	}
	fresh := r.c.qp(qpOpt{srq: r.srq})
	e.errIs("PostRecv on an SRQ's QP in RESET", fresh.PostRecv([]verbs.RecvWR{rv}), verbs.ErrInvalid)
	// The refused receive is nowhere: a SEND finds the SRQ empty (RNR, then retried).
	wr := r.send(0, 0)
	e.expectNoWC(r.peers[0].scq, quiet, "P1's send CQ: the receive refused on the QP must not have been queued")
	vs := r.post(1)
	r.received(e.poll1(r.c.rcq, "C's receive"), 0, 0, vs[0])
	r.sent(0, wr)
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ after the refused posts")

	c := r.srq.Cap()
	e.Logf("SRQ created for 8 receives of 1 SGE reports Cap %+v", c)
	sges := make([]verbs.SGE, c.MaxSGE+1)
	for i := range sges {
		sges[i] = verbs.SGEFor(r.rbuf, i*8, 8)
	}
	ok := verbs.RecvWR{WRID: e.newWRID(), SGL: []verbs.SGE{verbs.SGEFor(r.rbuf, 0, srqMsg)}}
	err = r.srq.PostRecv([]verbs.RecvWR{ok, {WRID: e.newWRID(), SGL: sges}})
	if e.errIs(fmt.Sprintf("SRQ receive with %d SGEs (max_sge %d)", len(sges), c.MaxSGE), err, verbs.ErrInvalid) {
		e.postErrIndex("SRQ receive with too many SGEs", err, 1)
	}
	full := make([]verbs.RecvWR, c.MaxWR)
	for i := range full {
		full[i] = verbs.RecvWR{WRID: e.newWRID(), SGL: []verbs.SGE{verbs.SGEFor(r.rbuf, (i%256)*srqMsg, srqMsg)}}
	}
	// One receive (ok) is queued already: the capacity runs out at index MaxWR-1.
	err = r.srq.PostRecv(full)
	if e.errIs(fmt.Sprintf("%d receives posted to an SRQ of capacity %d", c.MaxWR+1, c.MaxWR), err, verbs.ErrQueueFull) {
		e.postErrIndex("SRQ receive beyond its capacity", err, c.MaxWR-1)
	}

	pd2 := r.c.newPD()
	other, err := verbs.CreateSRQ(pd2, verbs.SRQAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		e.setupf("create an SRQ on a second PD: %v", err)
	}
	r.c.track(rankSRQ, "SRQ of the second PD", other, other.Destroy)
	qp, err := r.c.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.c.scq, RecvCQ: r.c.rcq, SRQ: other,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err == nil {
		r.c.track(rankQP, "QP with another PD's SRQ", qp, qp.Destroy)
		e.Errorf("CreateQP with an SRQ of another PD succeeded, want ErrInvalid")
	} else {
		e.errIs("CreateQP with an SRQ of another PD", err, verbs.ErrInvalid)
	}
}

// Q4: the receives of an SRQ belong to it, not to a QP: destroying one of its QPs (a) or
// moving it to ERR (b) flushes none of them, and the other QP's peer then receives into
// them, in post order.
func caseQ4(e *env, destroy bool) {
	r := e.newSRQRig(2, 8, nil)
	vs := r.post(3)
	if destroy {
		if err := r.c.free(r.qc[0]); err != nil {
			e.Fatalf("destroy C's first QP: %v", err)
		}
	} else {
		if err := r.qc[0].Modify(verbs.QPAttr{State: verbs.QPStateError}); err != nil {
			e.Fatalf("modify C's first QP to ERR: %v", err)
		}
		e.waitState(r.qc[0], verbs.QPStateError, "C's first QP")
	}
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ: the SRQ's receives must not flush with one of its QPs")
	var wrs []verbs.SendWR
	for m := 0; m < 3; m++ {
		wrs = append(wrs, r.send(1, m))
	}
	wcs := e.pollN(r.c.rcq, 3, "C's receives through the other QP")
	for m, wc := range wcs {
		r.received(wc, 1, m, vs[m])
	}
	for m, wc := range e.pollN(r.peers[1].scq, 3, "P2's SENDs") {
		e.checkWC(fmt.Sprintf("P2's SEND %d", m), wc, r.qp[1], wrs[m].WRID, verbs.WCSuccess, verbs.WCSend)
	}
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ")
}

// Q5: destroying an SRQ that a QP uses fails with ErrBusy and leaves it working; once its
// QPs are gone it can be destroyed with receives still posted (they are dropped, without
// completions); after that it is closed: posting, attaching a QP and destroying it again
// fail with ErrClosed.
func caseQ5(e *env) {
	r := e.newSRQRig(1, 8, nil)
	vs := r.post(2)
	e.errIs("Destroy of an SRQ a QP uses", r.srq.Destroy(), verbs.ErrBusy)
	wr := r.send(0, 0)
	r.received(e.poll1(r.c.rcq, "C's receive after the refused Destroy"), 0, 0, vs[0])
	r.sent(0, wr)
	if err := r.c.free(r.qc[0]); err != nil {
		e.Fatalf("destroy C's QP: %v", err)
	}
	if err := r.c.free(r.srq); err != nil {
		e.Fatalf("Destroy of the SRQ once its QP is gone (one receive still posted): %v", err)
	}
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ: the receive left in the destroyed SRQ")
	rv := verbs.RecvWR{WRID: e.newWRID(), SGL: []verbs.SGE{verbs.SGEFor(r.rbuf, 0, srqMsg)}}
	e.errIs("PostRecv to a destroyed SRQ", r.srq.PostRecv([]verbs.RecvWR{rv}), verbs.ErrClosed)
	e.errIs("second Destroy of an SRQ", r.srq.Destroy(), verbs.ErrClosed)
	qp, err := r.c.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.c.scq, RecvCQ: r.c.rcq, SRQ: r.srq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err == nil {
		r.c.track(rankQP, "QP with a destroyed SRQ", qp, qp.Destroy)
		e.Errorf("CreateQP with a destroyed SRQ succeeded, want ErrClosed")
	} else {
		e.errIs("CreateQP with a destroyed SRQ", err, verbs.ErrClosed)
	}
}

// Q6: a SEND_WITH_INV received through an SRQ invalidates the rkey as one received into a
// QP's own queue does (I1): the receive reports WITH_INV and the rkey, the window can be
// bound again with IncRkey, and a READ with the old rkey fails REM_ACCESS_ERR. That error
// moves C's QP to ERR, which flushes none of the SRQ's receives.
func caseQ6(e *env) {
	r := e.newRig(rigOpt{srq: true})
	mw := r.c.mw(verbs.MWType2)
	k1 := r.bind(mw, 0, 4096, rr)
	r.readOK(k1, r.winAddr(0), 4096, 0)
	r.sendInvOK(k1)
	k2 := r.bind(mw, 4096, 4096, rr)
	r.readOK(k2, r.winAddr(4096), 4096, 4096)
	r.recvC(64) // stays in the SRQ
	wr := r.readWR(k1, r.winAddr(0), 64, 0)
	e.postSend(r.qs, wr)
	wc := e.poll1(r.s.scq, "READ with the invalidated rkey")
	e.checkWC(fmt.Sprintf("READ with the rkey %#x invalidated through the SRQ", k1), wc, r.qs, wr.WRID, verbs.WCRemAccessErr, 0)
	e.waitState(r.qc, verbs.QPStateError, "C's QP after refusing the READ")
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ: the receive posted to the SRQ must not flush with C's QP")
}

// Q7: the SRQ limit. Arming it above the SRQ's capacity fails with ErrInvalid; above the
// receives posted it is accepted, stays quiet, and fires when the next receive is taken.
// Armed at 2 with 3 posted, it signals LimitReached once, when the receive taken leaves 1,
// and not again until it is armed anew; 0 disarms it.
func caseQ7(e *env) {
	r := e.newSRQRig(1, 8, nil)
	vs := r.post(4)
	c := r.srq.Cap().MaxWR
	e.errIs(fmt.Sprintf("ArmLimit(%d) of an SRQ of capacity %d", c+1, c), r.srq.ArmLimit(c+1), verbs.ErrInvalid)
	if err := r.srq.ArmLimit(5); err != nil {
		e.Fatalf("ArmLimit(5) with 4 receives posted: %v", err)
	}
	e.noLimit(r.srq, "armed at 5 with 4 receives posted, none taken yet")
	m := 0
	use := func(v recv) { // one SEND into receive v
		e.t.Helper()
		wr := r.send(0, m)
		r.received(e.poll1(r.c.rcq, fmt.Sprintf("C's receive %d", m)), 0, m, v)
		r.sent(0, wr)
		m++
	}
	use(vs[0])
	e.waitLimit(r.srq, "armed at 5 with 4 receives posted, then one taken")
	if err := r.srq.ArmLimit(2); err != nil {
		e.Fatalf("ArmLimit(2) with 3 receives posted: %v", err)
	}
	use(vs[1])
	e.noLimit(r.srq, "with 2 receives left and the limit at 2")
	use(vs[2])
	e.waitLimit(r.srq, "with 1 receive left and the limit at 2")
	use(vs[3])
	e.noLimit(r.srq, "after the limit fired once (it disarms)")
	vs = r.post(3)
	if err := r.srq.ArmLimit(3); err != nil {
		e.Fatalf("ArmLimit(3) with 3 receives posted: %v", err)
	}
	use(vs[0])
	e.waitLimit(r.srq, "rearmed at 3, with 2 receives left")
	if err := r.srq.ArmLimit(2); err != nil {
		e.Fatalf("ArmLimit(2) with 2 receives posted: %v", err)
	}
	if err := r.srq.ArmLimit(0); err != nil {
		e.Fatalf("ArmLimit(0): %v", err)
	}
	use(vs[1])
	e.noLimit(r.srq, "disarmed with ArmLimit(0)")
}

// waitLimit waits for srq's limit event within the timeout.
func (e *env) waitLimit(srq verbs.SRQ, what string) {
	e.t.Helper()
	select {
	case <-srq.LimitReached():
	case <-time.After(e.timeout):
		e.Errorf("SRQ limit %s: no LimitReached within %v", what, e.timeout)
	}
}

// noLimit checks that srq's limit does not signal within the quiet period.
func (e *env) noLimit(srq verbs.SRQ, what string) {
	e.t.Helper()
	select {
	case <-srq.LimitReached():
		e.Errorf("SRQ limit %s: LimitReached signalled, want no event", what)
	case <-time.After(quiet):
	}
}
