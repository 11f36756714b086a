package verbstest

import (
	"github.com/mwrpc/mwrpc/transport/verbs"
)

func invCases() []testCase {
	cs := []testCase{{"I1", "send_with_inv", caseI1}}
	cs = append(cs, i2Variants...)
	cs = append(cs, testCase{"I3", "local_inv_type2", caseI3})
	cs = append(cs, i4Variants...)
	cs = append(cs,
		testCase{"I5a", "dereg_busy_then_local_inv", func(e *env) { caseI5(e, false) }},
		testCase{"I5b", "dereg_busy_then_dealloc", func(e *env) { caseI5(e, true) }},
	)
	return cs
}

// I1: SEND_WITH_INV(rkey of C's bound type-2 window) from S: S's SEND completes SUCCESS,
// C's receive is a RECV with WITH_INV and the rkey; rebinding the window with IncRkey
// succeeds (and serves READs); a READ with the invalidated rkey fails REM_ACCESS_ERR.
func caseI1(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k1 := r.bind(mw, 0, 4096, rr)
	r.readOK(k1, r.winAddr(0), 4096, 0)
	r.sendInvOK(k1)
	k2 := r.bind(mw, 4096, 4096, rr)
	if k2 != verbs.IncRkey(k1) {
		e.Fatalf("internal: rebind key %#x is not IncRkey(%#x)", k2, k1)
	}
	r.readOK(k2, r.winAddr(4096), 4096, 4096)
	r.expectRemoteAccessErr(k1, r.winAddr(0), 64)
}

// i2Variants: SEND_WITH_INV with a key C must not invalidate: C's receive completes
// REM_INV_REQ_ERR and C's QP goes to ERR. The sender may see SUCCESS (rxe) or an error;
// either is logged, but it must complete.
var i2Variants = []testCase{
	{"I2a", "stale_key", func(e *env) {
		i2(e, func(r *rig) uint32 {
			mw := r.c.mw(verbs.MWType2)
			k1 := r.bind(mw, 0, 4096, rr)
			r.localInvOK(k1)
			r.bind(mw, 0, 4096, rr)
			return k1 // the key of the previous binding
		})
	}},
	{"I2b", "mr_key", func(e *env) {
		i2(e, func(r *rig) uint32 { return r.win.RKey() })
	}},
	{"I2c", "type1_window", func(e *env) {
		i2(e, func(r *rig) uint32 {
			k := r.bindType1(r.c.mw(verbs.MWType1), 0, 4096, rr)
			r.readOK(k, r.winAddr(0), 64, 0)
			return k
		})
	}},
}

func i2(e *env, setup func(r *rig) uint32) {
	r := e.newRig(rigOpt{})
	key := setup(r)
	rv := r.recvC(64)
	wr := r.sWR(verbs.WRSendWithInv, []byte("bad invalidation"))
	wr.InvalidateRKey = key
	e.postSend(r.qs, wr)
	rc := e.poll1(r.c.rcq, "C's receive")
	e.checkWC("receive of a SEND_WITH_INV with a key C cannot invalidate", rc, r.qc, rv.wrid, verbs.WCRemInvReqErr, 0)
	e.waitState(r.qc, verbs.QPStateError, "C's QP after REM_INV_REQ_ERR")
	wc := e.poll1(r.s.scq, "S's SEND_WITH_INV")
	if wc.WRID != wr.WRID || wc.QPNum != r.qs.Num() {
		e.Errorf("S's completion %v, want wrid %d on QP %d", wc, wr.WRID, r.qs.Num())
	}
	e.Logf("sender's SEND_WITH_INV completed %v; S's QP is in %v", wc.Status, r.qs.State())
}

// bindType1 binds the type-1 window w over [off, off+n) of win through C's QP with
// MW.Bind, waits for the BIND_MW completion and returns the window's new rkey, which must
// also be what MW.RKey() reports and keep the window's index.
func (r *rig) bindType1(w verbs.MW, off, n int, access verbs.Access) uint32 {
	r.e.t.Helper()
	old := w.RKey()
	wrid := r.e.newWRID()
	k, err := w.Bind(r.qc, wrid, verbs.SendSignaled, verbs.MWBind{MR: r.win, Addr: r.winAddr(off), Length: uint64(n), Access: access})
	if err != nil {
		r.e.Fatalf("type-1 MW.Bind: %v", err)
	}
	if got := w.RKey(); got != k {
		r.e.Errorf("type-1 MW.Bind returned rkey %#x but MW.RKey() is %#x", k, got)
	}
	if verbs.KeyIndex(k) != verbs.KeyIndex(old) {
		r.e.Errorf("type-1 MW.Bind changed the key index: %#x -> %#x", old, k)
	}
	if k == old {
		r.e.Errorf("type-1 MW.Bind kept the rkey %#x", k)
	}
	wc := r.e.poll1(r.c.scq, "type-1 bind")
	if !r.e.checkWC("type-1 MW.Bind", wc, r.qc, wrid, verbs.WCSuccess, verbs.WCBindMW) {
		r.e.Fatalf("cannot go on")
	}
	return k
}

// I3: LOCAL_INV of a bound type-2 window: SUCCESS with opcode LOCAL_INV; the window can be
// bound again with IncRkey.
func caseI3(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 0, 4096, rr)
	r.localInvOK(k)
	e.wantState(r.qc, verbs.QPStateRTS, "C's QP after LOCAL_INV")
	k2 := r.bind(mw, 0, 4096, rr)
	r.readOK(k2, r.winAddr(0), 4096, 0)
}

// i4Variants: LOCAL_INV of something that is not a bound type-2 window under that key:
// LOC_QP_OP_ERR, and the QP goes to ERR.
var i4Variants = []testCase{
	{"I4a", "user_mr", func(e *env) {
		i4(e, func(r *rig) uint32 { return r.win.RKey() })
	}},
	{"I4b", "type1_window", func(e *env) {
		i4(e, func(r *rig) uint32 { return r.bindType1(r.c.mw(verbs.MWType1), 0, 4096, rr) })
	}},
	{"I4c", "wrong_key", func(e *env) {
		i4(e, func(r *rig) uint32 {
			k := r.bind(r.c.mw(verbs.MWType2), 0, 4096, rr)
			return verbs.IncRkey(k)
		})
	}},
}

func i4(e *env, setup func(r *rig) uint32) {
	r := e.newRig(rigOpt{})
	key := setup(r)
	wr := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: key}
	after := r.cWR(verbs.WRSend, []byte("after"))
	e.postSend(r.qc, wr, after)
	wcs := e.pollN(r.c.scq, 2, "LOCAL_INV and the SEND after it")
	e.checkWC("invalid LOCAL_INV", wcs[0], r.qc, wr.WRID, verbs.WCLocQPOpErr, 0)
	e.checkWC("SEND posted after it", wcs[1], r.qc, after.WRID, verbs.WCWRFlushErr, 0)
	e.waitState(r.qc, verbs.QPStateError, "C's QP after LOC_QP_OP_ERR")
}

// I5: deregistering an MR with a window bound to it fails with ErrBusy (EINVAL in
// libibverbs) and leaves the MR working; after LOCAL_INV (a) or dealloc (b) of the window
// it succeeds.
func caseI5(e *env, dealloc bool) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 0, 4096, rr)
	err := r.win.Dereg()
	if err == nil {
		r.c.forget(r.win)
		e.Fatalf("Dereg of an MR with a bound window succeeded, want ErrBusy")
	}
	e.errIs("Dereg of an MR with a bound window", err, verbs.ErrBusy)
	r.readOK(k, r.winAddr(0), 4096, 0)
	if dealloc {
		if err := r.c.free(mw); err != nil {
			e.Fatalf("dealloc of the bound window: %v", err)
		}
	} else {
		r.localInvOK(k)
	}
	if err := r.c.free(r.win); err != nil {
		e.Errorf("Dereg after the window was released: %v", err)
	}
}
