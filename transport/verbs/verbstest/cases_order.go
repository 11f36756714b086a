package verbstest

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

func orderCases() []testCase {
	return []testCase{
		{"O1", "bind_then_send_ordered", caseO1},
		{"O2", "read_then_local_inv", caseO2},
		{"O3", "inline_above_max", caseO3},
		{"O4", "reads_beyond_max_rd_atomic", caseO4},
		{"O5", "flush_after_error", caseO5},
	}
}

// O1: an unsignaled BIND_MW followed on the same QP by a SEND carrying the new rkey: the
// SEND is executed after the bind, so the peer's READ with that rkey succeeds. The bind
// itself produces no completion.
func caseO1(e *env) {
	r := e.newRig(rigOpt{})
	for round := 0; round < 3; round++ {
		mw := r.c.mw(verbs.MWType2)
		key := verbs.IncRkey(mw.RKey())
		off, n := 8192+round*4096, 4096
		bw := r.bindWR(mw, key, r.win, off, n, rr)
		bw.Flags = 0 // unsignaled
		var hdr [16]byte
		binary.LittleEndian.PutUint64(hdr[0:], r.winAddr(off))
		binary.LittleEndian.PutUint32(hdr[8:], uint32(n))
		binary.LittleEndian.PutUint32(hdr[12:], key)
		sw := r.cWR(verbs.WRSend, hdr[:])
		rv := r.recvS(64)
		e.postSend(r.qc, bw, sw)
		rc := e.poll1(r.s.rcq, "S's receive of the header")
		if !e.checkWC("receive of the header", rc, r.qs, rv.wrid, verbs.WCSuccess, verbs.WCRecv) {
			e.Fatalf("cannot go on")
		}
		b := rv.bytes()
		addr, ln, k := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:])
		r.readOK(k, addr, int(ln), off) // at once, on the header's word
		wc := e.poll1(r.c.scq, "C's SEND")
		e.checkWC("SEND after the unsignaled bind", wc, r.qc, sw.WRID, verbs.WCSuccess, verbs.WCSend)
		r.keys[mw] = key
	}
	e.expectNoWC(r.c.scq, quiet, "C's send CQ (the binds were unsignaled)")
}

// O2: a READ in flight, then a LOCAL_INV on the same QP: the READ completes first (send
// queue completions are in order), with its data.
func caseO2(e *env) {
	const size = 1 << 20
	r := e.newRig(rigOpt{winSize: size})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 0, size, rr)
	// S's own window, to invalidate on S's QP.
	smr := r.s.mr(8192, verbs.AccessLocalWrite|verbs.AccessMWBind)
	smw := r.s.mw(verbs.MWType2)
	skey := verbs.IncRkey(smw.RKey())
	bw := r.bindWR(smw, skey, smr, 0, 8192, rr)
	e.postSend(r.qs, bw)
	if wc := e.poll1(r.s.scq, "S's bind"); !e.checkWC("S's BIND_MW", wc, r.qs, bw.WRID, verbs.WCSuccess, verbs.WCBindMW) {
		e.Fatalf("cannot go on")
	}
	for round := 0; round < 3; round++ {
		clear(r.readBuf.Bytes())
		rd := r.readWR(k, r.winAddr(0), size, 0)
		inv := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: skey}
		e.postSend(r.qs, rd, inv)
		wcs := e.pollN(r.s.scq, 2, "READ and LOCAL_INV")
		e.checkWC("READ posted before the LOCAL_INV", wcs[0], r.qs, rd.WRID, verbs.WCSuccess, verbs.WCRDMARead)
		e.checkWC("LOCAL_INV posted after the READ", wcs[1], r.qs, inv.WRID, verbs.WCSuccess, verbs.WCLocalInv)
		e.wantBytes("1 MiB READ", r.readBuf.Bytes(), r.win.Bytes())
		// Bind S's window again for the next round.
		skey = verbs.IncRkey(skey)
		bw := r.bindWR(smw, skey, smr, 0, 8192, rr)
		e.postSend(r.qs, bw)
		if wc := e.poll1(r.s.scq, "S's bind"); !e.checkWC("S's BIND_MW", wc, r.qs, bw.WRID, verbs.WCSuccess, verbs.WCBindMW) {
			e.Fatalf("cannot go on")
		}
	}
}

// O3: an inline SEND of more than the QP's max_inline_data is refused at post time with
// ErrInvalid (the requests before it in the batch are queued); one of exactly
// max_inline_data is sent, its data copied at post time.
func caseO3(e *env) {
	r := e.newRig(rigOpt{})
	maxInline := r.qs.Cap().MaxInlineData
	e.Logf("S's QP: max_inline_data %d", maxInline)
	if maxInline > 0 {
		payload := make([]byte, maxInline)
		fillPattern(payload, 3)
		rv := r.recvC(maxInline)
		wr := r.sWR(verbs.WRSend, payload)
		wr.Flags |= verbs.SendInline
		e.postSend(r.qs, wr)
		// Inline data is the NIC's from the moment of the post: overwrite the source.
		clear(r.smsg.Bytes()[wr.SGL[0].Addr-r.smsg.Addr():][:maxInline])
		wc := e.poll1(r.s.scq, "inline SEND")
		e.checkWC("inline SEND of max_inline_data bytes", wc, r.qs, wr.WRID, verbs.WCSuccess, verbs.WCSend)
		rc := e.poll1(r.c.rcq, "C's receive")
		if e.checkWC("receive of the inline SEND", rc, r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv) {
			if rc.ByteLen != uint32(maxInline) {
				e.Errorf("receive of the inline SEND: byte_len %d, want %d", rc.ByteLen, maxInline)
			}
			e.wantBytes("inline data (copied at post time)", rv.bytes(), payload)
		}
	}
	rv := r.recvC(64)
	ok := r.sWR(verbs.WRSend, []byte("before the refused one"))
	big := r.sWR(verbs.WRSend, make([]byte, maxInline+1))
	big.Flags |= verbs.SendInline
	err := r.qs.PostSend([]verbs.SendWR{ok, big})
	if e.errIs(fmt.Sprintf("inline SEND of %d bytes (max_inline_data %d)", maxInline+1, maxInline), err, verbs.ErrInvalid) {
		e.postErrIndex("inline SEND above max_inline_data", err, 1)
	}
	wc := e.poll1(r.s.scq, "the SEND queued before the refused one")
	e.checkWC("SEND queued before the refused one", wc, r.qs, ok.WRID, verbs.WCSuccess, verbs.WCSend)
	rc := e.poll1(r.c.rcq, "C's receive")
	e.checkWC("receive", rc, r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv)
	e.expectNoWC(r.s.scq, quiet, "S's send CQ after the refused post")
	e.wantState(r.qs, verbs.QPStateRTS, "S's QP after the refused post")
}

// O4: with max_rd_atomic N, N+1 up to 3N READs posted at once all complete SUCCESS, in
// order (the excess waits its turn).
func caseO4(e *env) {
	const n = 2
	p := cm.DefaultParams()
	p.MaxRdAtomic, p.MaxDestRdAtomic = n, n
	r := e.newRig(rigOpt{pc: &p, ps: &p})
	mw := r.c.mw(verbs.MWType2)
	size := len(r.win.Bytes())
	k := r.bind(mw, 0, size, rr)
	for count := n + 1; count <= 3*n; count++ {
		clear(r.readBuf.Bytes())
		wrs := make([]verbs.SendWR, count)
		for i := range wrs {
			off := i * 4096
			wrs[i] = r.readWR(k, r.winAddr(off+count), 4000, off)
		}
		e.postSend(r.qs, wrs...)
		wcs := e.pollN(r.s.scq, count, fmt.Sprintf("%d READs with max_rd_atomic %d", count, n))
		for i, wc := range wcs {
			e.checkWC(fmt.Sprintf("READ %d of %d", i, count), wc, r.qs, wrs[i].WRID, verbs.WCSuccess, verbs.WCRDMARead)
			off := i * 4096
			e.wantBytes(fmt.Sprintf("READ %d of %d", i, count), r.readBuf.Bytes()[off:off+4000], r.win.Bytes()[off+count:off+count+4000])
		}
	}
}

// O5: an error on WR k: the WRs after it, signaled or not, each complete with
// WR_FLUSH_ERR, as do the posted receives, and so does a WR posted to the QP in ERR.
func caseO5(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 0, 8192, rr)
	rv1, rv2 := r.recvS(64), r.recvS(64)
	w0 := r.readWR(k, r.winAddr(0), 1024, 0)
	w1 := r.readWR(verbs.IncRkey(k), r.winAddr(0), 1024, 1024) // refused
	w2 := r.sWR(verbs.WRSend, []byte("unsignaled 1"))
	w3 := r.readWR(k, r.winAddr(0), 1024, 2048)
	w4 := r.sWR(verbs.WRSendWithImm, []byte("unsignaled 3"))
	w2.Flags, w3.Flags, w4.Flags = 0, 0, 0
	e.postSend(r.qs, w0, w1, w2, w3, w4)
	wcs := e.pollN(r.s.scq, 5, "the five WRs")
	e.checkWC("WR 0 (READ)", wcs[0], r.qs, w0.WRID, verbs.WCSuccess, verbs.WCRDMARead)
	e.checkWC("WR 1 (READ with a bad key)", wcs[1], r.qs, w1.WRID, verbs.WCRemAccessErr, 0)
	for i, w := range []verbs.SendWR{w2, w3, w4} {
		e.checkWC(fmt.Sprintf("unsignaled WR %d after the error", i+2), wcs[i+2], r.qs, w.WRID, verbs.WCWRFlushErr, 0)
	}
	e.waitState(r.qs, verbs.QPStateError, "S's QP")
	rcs := e.pollN(r.s.rcq, 2, "S's posted receives")
	e.checkWC("receive 1", rcs[0], r.qs, rv1.wrid, verbs.WCWRFlushErr, 0)
	e.checkWC("receive 2", rcs[1], r.qs, rv2.wrid, verbs.WCWRFlushErr, 0)
	// Posting to a QP in ERR is allowed; the requests flush.
	w5 := r.sWR(verbs.WRSend, []byte("posted in ERR"))
	e.postSend(r.qs, w5)
	e.checkWC("SEND posted in ERR", e.poll1(r.s.scq, "SEND posted in ERR"), r.qs, w5.WRID, verbs.WCWRFlushErr, 0)
	rv3 := r.recvS(64)
	e.checkWC("receive posted in ERR", e.poll1(r.s.rcq, "receive posted in ERR"), r.qs, rv3.wrid, verbs.WCWRFlushErr, 0)
	e.expectNoWC(r.s.scq, quiet, "S's send CQ")
}

func rnrCases() []testCase {
	return []testCase{
		{"S1a", "rnr_retry_exceeded", caseS1a},
		{"S1b", "rnr_late_receive", caseS1b},
		{"S2", "send_longer_than_receive", caseS2},
	}
}

// S1a: a SEND with no receive posted is retried after receiver-not-ready NAKs; once the
// RNR retries run out (RNRRetry 1, 1 ms RNR timer) it completes RNR_RETRY_EXC_ERR.
func caseS1a(e *env) {
	p := cm.DefaultParams()
	p.RNRRetry, p.MinRNRTimer = 1, time.Millisecond
	r := e.newRig(rigOpt{pc: &p, ps: &p})
	wr := r.sWR(verbs.WRSend, []byte("nobody listens"))
	start := time.Now()
	e.postSend(r.qs, wr)
	wc := e.poll1(r.s.scq, "SEND without a receive")
	e.checkWC("SEND without a receive, RNRRetry 1", wc, r.qs, wr.WRID, verbs.WCRNRRetryExcErr, 0)
	e.Logf("RNR_RETRY_EXC_ERR after %v", time.Since(start).Round(time.Microsecond))
	e.waitState(r.qs, verbs.QPStateError, "S's QP after RNR_RETRY_EXC_ERR")
	e.Logf("C's QP is in %v", r.qc.State())
}

// S1b: with RNRRetry 7 (infinite) a SEND waits for a receive posted late (20 ms) and then
// succeeds.
func caseS1b(e *env) {
	r := e.newRig(rigOpt{}) // cm.DefaultParams: RNRRetry 7, 1 ms RNR timer
	payload := []byte("late receive")
	wr := r.sWR(verbs.WRSend, payload)
	e.postSend(r.qs, wr)
	e.expectNoWC(r.s.scq, quiet, "S's send CQ while C has no receive")
	rv := r.recvC(64)
	wc := e.poll1(r.s.scq, "SEND")
	e.checkWC("SEND retried until a receive was posted", wc, r.qs, wr.WRID, verbs.WCSuccess, verbs.WCSend)
	rc := e.poll1(r.c.rcq, "C's late receive")
	if e.checkWC("late receive", rc, r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv) {
		e.wantBytes("late receive", rv.bytes()[:len(payload)], payload)
	}
	e.wantState(r.qs, verbs.QPStateRTS, "S's QP")
}

// S2: a SEND longer than the posted receive buffer: the receiver's completion is
// LOC_LEN_ERR and its QP goes to ERR. The sender's completion is logged.
func caseS2(e *env) {
	r := e.newRig(rigOpt{})
	rv := r.recvC(16)
	wr := r.sWR(verbs.WRSend, make([]byte, 64))
	e.postSend(r.qs, wr)
	rc := e.poll1(r.c.rcq, "C's receive")
	e.checkWC("16-byte receive of a 64-byte SEND", rc, r.qc, rv.wrid, verbs.WCLocLenErr, 0)
	e.waitState(r.qc, verbs.QPStateError, "C's QP after LOC_LEN_ERR")
	wc := e.poll1(r.s.scq, "S's SEND")
	if wc.WRID != wr.WRID {
		e.Errorf("S's completion %v, want wrid %d", wc, wr.WRID)
	}
	e.Logf("sender's SEND completed %v (IBTA: REM_INV_REQ_ERR); S's QP is in %v", wc.Status, r.qs.State())
}
