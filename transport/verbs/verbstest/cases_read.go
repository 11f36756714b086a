package verbstest

import (
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

func readCases() []testCase {
	var cs []testCase
	cs = append(cs,
		testCase{"R1a", "read_inside_window", caseR1a},
		testCase{"R1b", "read_zero_based_offset", caseR1b},
	)
	cs = append(cs, r2Variants...)
	cs = append(cs,
		testCase{"R3a", "qp_without_remote_read", func(e *env) {
			p := cm.DefaultParams()
			p.Access = verbs.AccessRemoteWrite
			caseR3(e, rigOpt{pc: &p})
		}},
		testCase{"R3b", "max_dest_rd_atomic_zero", func(e *env) {
			p := cm.DefaultParams()
			p.MaxDestRdAtomic = 0
			caseR3(e, rigOpt{pc: &p})
		}},
		testCase{"R4", "zero_length_junk_rkey", caseR4},
		testCase{"R5", "target_without_local_write", caseR5},
		testCase{"R6", "past_window_end", caseR6},
	)
	return cs
}

// R1a: a bound window with REMOTE_READ serves READs anywhere inside it.
func caseR1a(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 4096, 8192, rr)
	r.readOK(k, r.winAddr(4096), 8192, 4096)      // the whole window
	r.readOK(k, r.winAddr(4096+100), 1000, 4196)  // inside it
	r.readOK(k, r.winAddr(4096+8192-1), 1, 12287) // its last byte
}

// R1b: a zero-based window takes remote addresses as offsets from its start.
func caseR1b(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 4096, 8192, rr|verbs.AccessZeroBased)
	r.readOK(k, 300, 500, 4096+300)
	r.readOK(k, 0, 8192, 4096)
}

// r2Variants: READs the responder must refuse: S gets REM_ACCESS_ERR and WR_FLUSH_ERR for
// the rest, and both QPs go to ERR. Each variant first shows the key working where it can.
var r2Variants = []testCase{
	{"R2a", "wrong_key8", func(e *env) {
		r := e.newRig(rigOpt{})
		mw := r.c.mw(verbs.MWType2)
		k := r.bind(mw, 0, 4096, rr)
		r.readOK(k, r.winAddr(0), 64, 0)
		r.expectRemoteAccessErr(verbs.IncRkey(k), r.winAddr(0), 64)
	}},
	{"R2b", "window_without_remote_read", func(e *env) {
		r := e.newRig(rigOpt{})
		mw := r.c.mw(verbs.MWType2)
		k := r.bind(mw, 0, 4096, rw)
		r.expectRemoteAccessErr(k, r.winAddr(0), 64)
	}},
	{"R2c", "window_bound_to_other_qp", func(e *env) {
		r := e.newRig(rigOpt{})
		other := r.newPair()
		mw := r.c.mw(verbs.MWType2)
		k := other.bind(mw, 0, 4096, rr) // bound through the other pair's C QP
		other.readOK(k, r.winAddr(0), 64, 0)
		r.expectRemoteAccessErr(k, r.winAddr(0), 64)
		e.wantState(other.qc, verbs.QPStateRTS, "the QP the window is bound to")
	}},
	{"R2d", "after_local_inv", func(e *env) {
		r := e.newRig(rigOpt{})
		mw := r.c.mw(verbs.MWType2)
		k := r.bind(mw, 0, 4096, rr)
		r.readOK(k, r.winAddr(0), 64, 0)
		r.localInvOK(k)
		r.expectRemoteAccessErr(k, r.winAddr(0), 64)
	}},
	{"R2e", "after_send_with_inv", func(e *env) {
		r := e.newRig(rigOpt{})
		mw := r.c.mw(verbs.MWType2)
		k := r.bind(mw, 0, 4096, rr)
		r.readOK(k, r.winAddr(0), 64, 0)
		r.sendInvOK(k)
		r.expectRemoteAccessErr(k, r.winAddr(0), 64)
	}},
	{"R2f", "after_dealloc", func(e *env) {
		r := e.newRig(rigOpt{})
		mw := r.c.mw(verbs.MWType2)
		k := r.bind(mw, 0, 4096, rr)
		r.readOK(k, r.winAddr(0), 64, 0)
		if err := r.c.free(mw); err != nil {
			e.Fatalf("dealloc of a bound type-2 window: %v", err)
		}
		r.expectRemoteAccessErr(k, r.winAddr(0), 64)
	}},
	{"R2g", "past_mr_end", func(e *env) {
		r := e.newRig(rigOpt{winAccess: defaultWinAccess | rr})
		n := len(r.win.Bytes())
		r.readOK(r.win.RKey(), r.winAddr(n-64), 64, n-64)
		r.expectRemoteAccessErr(r.win.RKey(), r.winAddr(n-32), 64)
	}},
}

// localInvOK posts a signaled LOCAL_INV of key on C's QP and expects SUCCESS.
func (r *rig) localInvOK(key uint32) {
	r.e.t.Helper()
	wr := verbs.SendWR{WRID: r.e.newWRID(), Opcode: verbs.WRLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: key}
	r.e.postSend(r.qc, wr)
	wc := r.e.poll1(r.c.scq, "LOCAL_INV")
	if !r.e.checkWC("LOCAL_INV of a bound type-2 window", wc, r.qc, wr.WRID, verbs.WCSuccess, verbs.WCLocalInv) {
		r.e.Fatalf("cannot go on")
	}
}

// sendInvOK sends SEND_WITH_INV(key) from S to a receive posted on C and expects SUCCESS
// on S and a receive with WITH_INV and the key on C.
func (r *rig) sendInvOK(key uint32) {
	r.e.t.Helper()
	rv := r.recvC(64)
	payload := []byte("release window")
	wr := r.sWR(verbs.WRSendWithInv, payload)
	wr.InvalidateRKey = key
	r.e.postSend(r.qs, wr)
	wc := r.e.poll1(r.s.scq, "SEND_WITH_INV")
	r.e.checkWC("SEND_WITH_INV", wc, r.qs, wr.WRID, verbs.WCSuccess, verbs.WCSend)
	rc := r.e.poll1(r.c.rcq, "receive of SEND_WITH_INV")
	if r.e.checkWC("receive of SEND_WITH_INV", rc, r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv) {
		if rc.Flags&verbs.WCWithInv == 0 || rc.InvalidatedRKey != key {
			r.e.Errorf("receive of SEND_WITH_INV(%#x): %v, want WITH_INV and invalidated rkey %#x", key, rc, key)
		}
		if rc.Flags&verbs.WCWithImm != 0 {
			r.e.Errorf("receive of SEND_WITH_INV: %v has WITH_IMM", rc)
		}
		if rc.ByteLen != uint32(len(payload)) {
			r.e.Errorf("receive of SEND_WITH_INV: byte_len %d, want %d", rc.ByteLen, len(payload))
		}
		r.e.wantBytes("SEND_WITH_INV payload", rv.bytes()[:len(payload)], payload)
	}
}

// R3: the responder refuses READs as an invalid request when C's QP does not grant
// REMOTE_READ or serves no READs (max_dest_rd_atomic 0): S gets REM_INV_REQ_ERR.
func caseR3(e *env, o rigOpt) {
	r := e.newRig(o)
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 0, 4096, rr)
	w1 := r.readWR(k, r.winAddr(0), 64, 0)
	w2 := r.readWR(k, r.winAddr(0), 64, 0)
	e.postSend(r.qs, w1, w2)
	wcs := e.pollN(r.s.scq, 2, "READs")
	e.checkWC("READ through a QP that serves no READs", wcs[0], r.qs, w1.WRID, verbs.WCRemInvReqErr, 0)
	e.checkWC("READ posted after it", wcs[1], r.qs, w2.WRID, verbs.WCWRFlushErr, 0)
	e.waitState(r.qs, verbs.QPStateError, "S's QP after REM_INV_REQ_ERR")
	e.Logf("C's QP (the responder) is in %v", r.qc.State())
}

// R4: a READ of length 0 transfers nothing, so its rkey and address are not checked:
// SUCCESS, and the QP stays usable.
func caseR4(e *env) {
	r := e.newRig(rigOpt{})
	wr := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		RemoteAddr: 0xdead_beef_0000, RKey: 0xdeadbeef}
	e.postSend(r.qs, wr)
	wc := e.poll1(r.s.scq, "zero-length READ")
	e.checkWC("READ of length 0 with a junk rkey", wc, r.qs, wr.WRID, verbs.WCSuccess, verbs.WCRDMARead)
	if wc.Status == verbs.WCSuccess && wc.ByteLen != 0 {
		e.Errorf("zero-length READ: byte_len %d, want 0", wc.ByteLen)
	}
	e.wantState(r.qs, verbs.QPStateRTS, "S's QP")
	e.wantState(r.qc, verbs.QPStateRTS, "C's QP")
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 0, 4096, rr)
	r.readOK(k, r.winAddr(0), 4096, 0)
}

// R5: a READ whose local target lies in an MR without LOCAL_WRITE: LOC_PROT_ERR on S.
func caseR5(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 0, 4096, rr)
	target := r.s.mr(4096, verbs.AccessRemoteRead) // no LOCAL_WRITE
	wr := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		RemoteAddr: r.winAddr(0), RKey: k, SGL: []verbs.SGE{verbs.SGEFor(target, 0, 4096)}}
	e.postSend(r.qs, wr)
	wc := e.poll1(r.s.scq, "READ")
	e.checkWC("READ into an MR without LOCAL_WRITE", wc, r.qs, wr.WRID, verbs.WCLocProtErr, 0)
	e.waitState(r.qs, verbs.QPStateError, "S's QP after LOC_PROT_ERR")
	for i, b := range target.Bytes() {
		if b != 0 {
			e.Errorf("the refused READ wrote byte %d of the read-only target", i)
			break
		}
	}
	e.Logf("C's QP is in %v", r.qc.State())
}

// R6: a READ past the window's end but inside its MR. The IBTA (and the soft provider)
// refuse it with REM_ACCESS_ERR; rxe checks only the MR and returns SUCCESS, which
// fixtures of ibv on rxe declare in Fixture.Divergent["R6"].
func caseR6(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 4096, 4096, rr)
	r.readOK(k, r.winAddr(8192-16), 16, 8192-16) // up to the last byte: fine
	r.expectRemoteAccessErr(k, r.winAddr(8192-16), 64)
}
