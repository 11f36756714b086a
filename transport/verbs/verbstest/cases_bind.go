package verbstest

import (
	"fmt"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

const (
	rr = verbs.AccessRemoteRead
	rw = verbs.AccessRemoteWrite
)

// quiet is how long "no completion" checks wait.
const quiet = 20 * time.Millisecond

func keyCases() []testCase {
	return []testCase{{"K1", "inc_rkey", caseK1}}
}

// K1: the key helpers follow libibverbs: IncRkey(0x123456FF) == 0x12345600.
func caseK1(e *env) {
	for _, c := range []struct{ in, want uint32 }{
		{0x123456FF, 0x12345600}, {0x12345600, 0x12345601}, {0, 1}, {0xFFFFFFFF, 0xFFFFFF00}, {0x1FE, 0x1FF},
	} {
		if got := verbs.IncRkey(c.in); got != c.want {
			e.Errorf("IncRkey(%#08x) = %#08x, want %#08x", c.in, got, c.want)
		}
	}
	k := verbs.MakeKey(0x123456, 0xab)
	if k != 0x123456ab || verbs.KeyIndex(k) != 0x123456 || verbs.Key8(k) != 0xab {
		e.Errorf("MakeKey(0x123456, 0xab) = %#x, KeyIndex %#x, Key8 %#x", k, verbs.KeyIndex(k), verbs.Key8(k))
	}
	x := k
	for i := 1; i <= 256; i++ {
		x = verbs.IncRkey(x)
		if verbs.KeyIndex(x) != 0x123456 {
			e.Errorf("IncRkey changed the index: %#x after %d increments", x, i)
			break
		}
		if i < 256 && x == k {
			e.Errorf("IncRkey came back to %#x after %d increments, want 256", k, i)
		}
	}
	if x != k {
		e.Errorf("256 IncRkeys of %#x give %#x, want the key itself (key8 wraps at 256)", k, x)
	}
}

func bindCases() []testCase {
	cs := []testCase{
		{"B1", "bind_type2", caseB1},
		{"B2", "bind_bound_type2", caseB2},
	}
	cs = append(cs, b3Variants...)
	cs = append(cs, testCase{"B4", "remote_write_without_local_write", caseB4})
	cs = append(cs, b5Variants...)
	cs = append(cs, testCase{"B6", "alloc_unknown_type", caseB6})
	return cs
}

// B1: a type-2 bind over an MR with MW_BIND completes SUCCESS with opcode BIND_MW; the
// window's MW.RKey() stays the allocation key (the caller tracks the bound rkey).
func caseB1(e *env) {
	r := e.newRig(rigOpt{})
	if !r.c.dev.Attr().MWType2 {
		e.Errorf("device %s reports MWType2 = false", r.c.dev.Name())
	}
	mw := r.c.mw(verbs.MWType2)
	k0 := mw.RKey()
	key := verbs.IncRkey(k0)
	wr := r.bindWR(mw, key, r.win, 0, 4096, rr)
	e.postSend(r.qc, wr)
	wc := e.poll1(r.c.scq, "BIND_MW")
	if !e.checkWC("BIND_MW of a free type-2 window", wc, r.qc, wr.WRID, verbs.WCSuccess, verbs.WCBindMW) {
		e.Fatalf("bind failed")
	}
	if got := mw.RKey(); got != k0 {
		e.Errorf("MW.RKey() = %#x after a BIND_MW with %#x, want the allocation key %#x (type-2 keys are tracked by the caller)", got, key, k0)
	}
	r.keys[mw] = key
	r.readOK(key, r.winAddr(0), 4096, 0)
	e.wantState(r.qc, verbs.QPStateRTS, "C's QP after the bind")
}

// B2: binding a type-2 window that is already bound fails with MW_BIND_ERR; the QP goes to
// ERR, its posted receives flush, and a WR posted afterwards flushes.
func caseB2(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	k1 := r.bind(mw, 0, 4096, rr)
	rv := r.recvC(64)
	wr := r.bindWR(mw, verbs.IncRkey(k1), r.win, 4096, 4096, rr)
	e.postSend(r.qc, wr)
	wc := e.poll1(r.c.scq, "second BIND_MW")
	e.checkWC("BIND_MW of a bound type-2 window", wc, r.qc, wr.WRID, verbs.WCMWBindErr, 0)
	e.waitState(r.qc, verbs.QPStateError, "C's QP after MW_BIND_ERR")
	rc := e.poll1(r.c.rcq, "C's posted receive")
	e.checkWC("receive posted before the error", rc, r.qc, rv.wrid, verbs.WCWRFlushErr, 0)
	after := r.cWR(verbs.WRSend, []byte("posted in ERR"))
	e.postSend(r.qc, after)
	wc = e.poll1(r.c.scq, "SEND posted after the error")
	e.checkWC("SEND posted on the QP in ERR", wc, r.qc, after.WRID, verbs.WCWRFlushErr, 0)
}

// b3Variants: bind errors detected when the BIND_MW executes: MW_BIND_ERR, QP to ERR.
var b3Variants = []testCase{
	{"B3a", "mr_without_mw_bind", func(e *env) {
		b3(e, func(r *rig, mw verbs.MW) verbs.SendWR {
			mr := r.c.mr(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
			return r.bindWR(mw, verbs.IncRkey(mw.RKey()), mr, 0, 4096, rr)
		})
	}},
	{"B3b", "range_outside_mr", func(e *env) {
		b3(e, func(r *rig, mw verbs.MW) verbs.SendWR {
			n := len(r.win.Bytes())
			return r.bindWR(mw, verbs.IncRkey(mw.RKey()), r.win, n-100, 200, rr)
		})
	}},
	{"B3c", "length_zero", func(e *env) {
		b3(e, func(r *rig, mw verbs.MW) verbs.SendWR {
			return r.bindWR(mw, verbs.IncRkey(mw.RKey()), r.win, 0, 0, rr)
		})
	}},
	{"B3d", "mw_pd_differs", func(e *env) {
		b3(e, func(r *rig, _ verbs.MW) verbs.SendWR {
			other := r.c.mwOn(r.c.newPD(), verbs.MWType2)
			return r.bindWR(other, verbs.IncRkey(other.RKey()), r.win, 0, 4096, rr)
		})
	}},
	// The Go model names the window by MWBind.MW, and the WR's rkey must name that same
	// window (rxe: the mw_rkey of the request must be the window's current key). A key
	// left over from another window (here a live one, so that no provider can have
	// recycled its index for this window) is refused.
	{"B3e", "stale_key", func(e *env) {
		b3(e, func(r *rig, mw verbs.MW) verbs.SendWR {
			other := r.c.mw(verbs.MWType2)
			return r.bindWR(mw, verbs.IncRkey(other.RKey()), r.win, 0, 4096, rr)
		})
	}},
}

func b3(e *env, mk func(r *rig, mw verbs.MW) verbs.SendWR) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	wr := mk(r, mw)
	e.postSend(r.qc, wr)
	wc := e.poll1(r.c.scq, "BIND_MW")
	e.checkWC("invalid BIND_MW", wc, r.qc, wr.WRID, verbs.WCMWBindErr, 0)
	e.waitState(r.qc, verbs.QPStateError, "C's QP after MW_BIND_ERR")
}

// B4: a window granting REMOTE_WRITE over an MR without LOCAL_WRITE: MW_BIND_ERR (a window
// granting only REMOTE_READ over the same MR binds).
func caseB4(e *env) {
	r := e.newRig(rigOpt{})
	mr := r.c.mr(8192, verbs.AccessMWBind)
	ok := r.c.mw(verbs.MWType2)
	r.bindOn(r.qc, ok, mr, 0, 4096, rr)
	bad := r.c.mw(verbs.MWType2)
	wr := r.bindWR(bad, verbs.IncRkey(bad.RKey()), mr, 4096, 4096, rw)
	e.postSend(r.qc, wr)
	wc := e.poll1(r.c.scq, "BIND_MW")
	e.checkWC("BIND_MW granting REMOTE_WRITE over an MR without LOCAL_WRITE", wc, r.qc, wr.WRID, verbs.WCMWBindErr, 0)
	e.waitState(r.qc, verbs.QPStateError, "C's QP after MW_BIND_ERR")
}

// b5Variants: binds refused at post time with verbs.ErrInvalid. The QP is untouched: it
// stays in RTS, nothing completes, and a valid bind then succeeds.
var b5Variants = []testCase{
	{"B5a", "bind_with_sge", func(e *env) {
		b5(e, func(r *rig, mw verbs.MW) error {
			wr := r.bindWR(mw, verbs.IncRkey(mw.RKey()), r.win, 0, 4096, rr)
			wr.SGL = []verbs.SGE{verbs.SGEFor(r.cmsg, 0, 16)}
			return postOne(e, r.qc, wr)
		})
	}},
	{"B5b", "bind_with_imm", func(e *env) {
		b5(e, func(r *rig, mw verbs.MW) error {
			wr := r.bindWR(mw, verbs.IncRkey(mw.RKey()), r.win, 0, 4096, rr)
			wr.ImmData = 0x1234
			return postOne(e, r.qc, wr)
		})
	}},
	{"B5c", "bind_on_non_rc_qp", func(e *env) {
		b5(e, func(r *rig, mw verbs.MW) error {
			attr := verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: r.c.scq, RecvCQ: r.c.rcq,
				Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}}
			ud, err := r.c.pd.CreateQP(attr)
			if err != nil {
				// A provider that has no UD QPs at all refuses the type when the QP is
				// created; that is the EINVAL of this row.
				e.Logf("CreateQP(UD) refused: %v", err)
				return err
			}
			r.c.track(rankQP, "UD QP", ud, ud.Destroy)
			reached := verbs.QPStateReset
			for _, a := range []verbs.QPAttr{{State: verbs.QPStateInit}, {State: verbs.QPStateRTR}, {State: verbs.QPStateRTS}} {
				if err := ud.Modify(a); err != nil {
					e.Logf("UD QP stays in %v: Modify to %v: %v", reached, a.State, err)
					break
				}
				reached = a.State
			}
			e.Logf("posting BIND_MW on a UD QP in %v", ud.State())
			wr := r.bindWR(mw, verbs.IncRkey(mw.RKey()), r.win, 0, 4096, rr)
			return postOne(e, ud, wr)
		})
	}},
	{"B5d", "type1_zero_based", func(e *env) {
		b5(e, func(r *rig, _ verbs.MW) error {
			w1 := r.c.mw(verbs.MWType1)
			k := w1.RKey()
			_, err := w1.Bind(r.qc, e.newWRID(), verbs.SendSignaled, verbs.MWBind{MR: r.win, Addr: 0, Length: 4096,
				Access: rr | verbs.AccessZeroBased})
			if got := w1.RKey(); got != k {
				e.Errorf("refused type-1 bind changed MW.RKey() from %#x to %#x", k, got)
			}
			return err
		})
	}},
	// The zero-based type-1 bind again, posted directly as a BIND_MW work request (the
	// way every libibverbs provider implements ibv_bind_mw) rather than through MW.Bind.
	{"B5e", "type1_zero_based_wr", func(e *env) {
		b5(e, func(r *rig, _ verbs.MW) error {
			w1 := r.c.mw(verbs.MWType1)
			wr := r.bindWR(w1, verbs.IncRkey(w1.RKey()), r.win, 0, 4096, rr|verbs.AccessZeroBased)
			return postOne(e, r.qc, wr)
		})
	}},
}

// postOne posts wr alone and, if it is refused, checks that the error is a PostError for
// index 0.
func postOne(e *env, qp verbs.QP, wr verbs.SendWR) error {
	e.t.Helper()
	err := qp.PostSend([]verbs.SendWR{wr})
	if err != nil {
		e.postErrIndex("post_send", err, 0)
	}
	return err
}

func b5(e *env, post func(r *rig, mw verbs.MW) error) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	err := post(r, mw)
	if e.errIs("post-time bind check", err, verbs.ErrInvalid) {
		e.Logf("refused as expected: %v", err)
	}
	e.wantState(r.qc, verbs.QPStateRTS, "C's QP after a refused post")
	e.expectNoWC(r.c.scq, quiet, "C's send CQ after a refused post")
	k := r.bind(mw, 0, 4096, rr)
	r.readOK(k, r.winAddr(0), 128, 0)
}

// B6: allocating a window of an unknown type fails with ErrInvalid.
func caseB6(e *env) {
	h := e.newHost("C")
	for _, t := range []verbs.MWType{0, 3, 0xff} {
		mw, err := h.pd.AllocMW(t)
		if err == nil {
			h.track(rankMW, fmt.Sprintf("MW of type %v", t), mw, mw.Dealloc)
		}
		e.errIs(fmt.Sprintf("AllocMW(%v)", t), err, verbs.ErrInvalid)
	}
}
