package verbstest

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

func rotationCases() []testCase {
	return []testCase{{"W1", "rebind_1000_key_wrap", caseW1}}
}

func concurrencyCases() []testCase {
	return []testCase{{"P1", "parallel_pairs", caseP1}}
}

// W1: the transport's rotation, 1000 times over one type-2 window: bind with IncRkey,
// READ, SEND_WITH_INV. Then the consequence of an 8-bit key:
//
//   - The rkey of exactly 256 binds ago equals the current rkey (key8 wraps at 256), so
//     it is accepted and reads the current binding, wherever that lies. Nothing in the
//     NIC can tell the two apart: a peer must never hold a key across 256 rebinds of a
//     window (the transport rotates through several windows and revokes each key well
//     before that).
//   - The rkey of 1..255 binds ago is refused with REM_ACCESS_ERR. Each sample uses a
//     fresh QP pair and window, because the error moves both QPs to ERR.
func caseW1(e *env) {
	r := e.newRig(rigOpt{})
	mw := r.c.mw(verbs.MWType2)
	const rounds = 1000
	offOf := func(i int) int { return (i % 15) * 4096 }
	keys := make([]uint32, rounds+1)
	keys[0] = mw.RKey()
	for i := 1; i <= rounds; i++ {
		keys[i] = r.bind(mw, offOf(i), 4096, rr)
		o := offOf(i) + i%64
		r.readOK(keys[i], r.winAddr(o), 64, o)
		if i < rounds {
			r.sendInvOK(keys[i])
		}
	}
	old, cur := keys[rounds-256], keys[rounds]
	if old != cur {
		e.Fatalf("rkey of 256 binds ago %#x differs from the current %#x: key8 did not wrap at 256", old, cur)
	}
	if offOf(rounds-256) == offOf(rounds) {
		e.Fatalf("internal: the two bindings overlap")
	}
	o := offOf(rounds)
	r.readOK(old, r.winAddr(o), 4096, o)
	e.Logf("rkey %#x, bound 256 binds ago over win[%d:+4096], equals the current rkey and READs the current binding win[%d:+4096]: "+
		"key8 has 256 values, so a key kept across 256 rebinds of a window aliases the new binding", old, offOf(rounds-256), o)
	r.sendInvOK(cur)

	for _, j := range []int{1, 2, 128, 255} {
		p := r.newPair()
		w := r.c.mw(verbs.MWType2)
		ks := make([]uint32, j+2)
		for i := 1; i <= j+1; i++ {
			ks[i] = p.bind(w, offOf(i), 4096, rr)
			if i <= j {
				p.sendInvOK(ks[i])
			}
		}
		p.readOK(ks[j+1], p.winAddr(offOf(j+1)), 64, offOf(j+1))
		e.Logf("rkey %#x from %d bind(s) ago (current %#x): READ must be refused", ks[1], j, ks[j+1])
		p.expectRemoteAccessErr(ks[1], p.winAddr(offOf(j+1)), 64)
	}
}

// P1: 8 QP pairs, each with 200 SENDs and 200 READs posted from two goroutines on S's
// QP and reaped by two more (S's send CQ, C's receive CQ): every completion is accounted
// for, SENDs arrive in order into the receives posted in order, READ data is right.
func caseP1(e *env) {
	const pairs = 8
	perPair := 200
	c, s := e.newHost("C"), e.newHost("S")
	if lim := min(c.dev.Attr().MaxQPWR, s.dev.Attr().MaxQPWR); lim > 0 && lim < 2*perPair {
		perPair = lim / 2
		e.Logf("device queue depth %d: %d SENDs and READs per pair", lim, perPair)
	}
	win := c.mr(64<<10, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	fillPattern(win.Bytes(), 11)
	ps := make([]*p1Pair, pairs)
	for pi := range ps {
		ps[pi] = newP1Pair(e, c, s, pi, perPair, win)
	}
	var (
		wg   sync.WaitGroup
		errs failures
	)
	timeout := 6 * e.timeout
	start := time.Now()
	for _, p := range ps {
		wg.Add(4)
		go func() { defer wg.Done(); p.post("SEND", p.sendWRs, &errs) }()
		go func() { defer wg.Done(); p.post("READ", p.readWRs, &errs) }()
		go func() { defer wg.Done(); p.checkSendCQ(timeout, &errs) }()
		go func() { defer wg.Done(); p.checkRecvCQ(timeout, &errs) }()
	}
	wg.Wait()
	e.Logf("%d pairs x (%d SENDs + %d READs) in %v", pairs, perPair, perPair, time.Since(start).Round(time.Millisecond))
	errs.report(e)
	for _, p := range ps {
		e.wantState(p.qs, verbs.QPStateRTS, "S's QP")
		e.wantState(p.qc, verbs.QPStateRTS, "C's QP")
	}
}

// p1Pair is one of P1's QP pairs: S's QP posts n SENDs into the receives of C's QP, and n
// READs of C's window win.
type p1Pair struct {
	pi, n            int // the pair's index, and how many SENDs and READs it posts
	qc, qs           verbs.QP
	crq, ssq         verbs.CQ // C's receive CQ, S's send CQ
	recvMR, sendMR   verbs.MR
	readMR, win      verbs.MR
	sendWRs, readWRs []verbs.SendWR
}

// P1's work request IDs: the kind in bits 40 and 41, the index below.
const (
	p1TagSend = 1 << 40
	p1TagRead = 2 << 40
)

// p1ReadOff is where in the window pair pi's READ i reads.
func p1ReadOff(pi, i int) int { return (i*64 + pi*8) % (64<<10 - 64) }

// newP1Pair connects pair pi's QPs, posts C's receives and builds S's work requests: SEND
// i carries pi<<32|i.
func newP1Pair(e *env, c, s *host, pi, n int, win verbs.MR) *p1Pair {
	p := &p1Pair{pi: pi, n: n, win: win}
	p.crq = c.newCQ(n)
	p.ssq = s.newCQ(2 * n)
	p.qc = c.qp(qpOpt{rcq: p.crq, cap: verbs.QPCap{MaxRecvWR: n}})
	p.qs = s.qp(qpOpt{scq: p.ssq, cap: verbs.QPCap{MaxSendWR: 2 * n}})
	e.connect(p.qc, cm.DefaultParams(), p.qs, cm.DefaultParams())
	p.recvMR = c.mr(n*16, verbs.AccessLocalWrite)
	p.sendMR = s.mr(n*16, verbs.AccessLocalWrite)
	p.readMR = s.mr(n*64, verbs.AccessLocalWrite)
	rwrs := make([]verbs.RecvWR, n)
	for i := range rwrs {
		rwrs[i] = verbs.RecvWR{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(p.recvMR, i*16, 16)}}
	}
	e.postRecv(p.qc, rwrs...)
	for i := range n {
		binary.LittleEndian.PutUint64(p.sendMR.Bytes()[i*16:], uint64(pi)<<32|uint64(i))
		p.sendWRs = append(p.sendWRs, verbs.SendWR{WRID: p1TagSend | uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEFor(p.sendMR, i*16, 8)}})
		p.readWRs = append(p.readWRs, verbs.SendWR{WRID: p1TagRead | uint64(i), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			RemoteAddr: win.Addr() + uint64(p1ReadOff(pi, i)), RKey: win.RKey(), SGL: []verbs.SGE{verbs.SGEFor(p.readMR, i*64, 64)}})
	}
	return p
}

// post posts wrs on S's QP, ten at a time.
func (p *p1Pair) post(kind string, wrs []verbs.SendWR, errs *failures) {
	const batch = 10
	for i := 0; i < len(wrs); i += batch {
		if err := p.qs.PostSend(wrs[i:min(i+batch, len(wrs))]); err != nil {
			errs.add("pair %d: post %ss %d..: %v", p.pi, kind, i, err)
			return
		}
	}
}

// checkSendCQ reaps S's send CQ: every SEND and READ once, SUCCESS, SENDs in order, READ
// data right.
func (p *p1Pair) checkSendCQ(timeout time.Duration, errs *failures) {
	wcs, err := pollUntil(p.ssq, 2*p.n, timeout)
	if err != nil {
		errs.add("pair %d: S's send CQ: %v", p.pi, err)
	}
	seen := make(map[uint64]bool)
	nextSend := 0
	for _, wc := range wcs {
		if wc.Status != verbs.WCSuccess || wc.QPNum != p.qs.Num() || seen[wc.WRID] {
			errs.add("pair %d: unexpected completion %v", p.pi, wc)
			continue
		}
		seen[wc.WRID] = true
		i := int(wc.WRID &^ (3 << 40))
		switch wc.WRID &^ (1<<40 - 1) {
		case p1TagSend:
			if wc.Opcode != verbs.WCSend || i != nextSend {
				errs.add("pair %d: %v, want SEND %d (SENDs complete in order)", p.pi, wc, nextSend)
			}
			nextSend = i + 1
		case p1TagRead:
			o := p1ReadOff(p.pi, i)
			got, want := p.readMR.Bytes()[i*64:i*64+64], p.win.Bytes()[o:o+64]
			if wc.Opcode != verbs.WCRDMARead || wc.ByteLen != 64 || string(got) != string(want) {
				errs.add("pair %d: READ %d: %v, data ok %v", p.pi, i, wc, string(got) == string(want))
			}
		default:
			errs.add("pair %d: completion with unknown wrid %v", p.pi, wc)
		}
	}
	if len(seen) != 2*p.n && err == nil {
		errs.add("pair %d: %d distinct completions, want %d", p.pi, len(seen), 2*p.n)
	}
}

// checkRecvCQ reaps C's receive CQ: the SENDs, in order, each into its receive.
func (p *p1Pair) checkRecvCQ(timeout time.Duration, errs *failures) {
	wcs, err := pollUntil(p.crq, p.n, timeout)
	if err != nil {
		errs.add("pair %d: C's receive CQ: %v", p.pi, err)
	}
	for i, wc := range wcs {
		got := binary.LittleEndian.Uint64(p.recvMR.Bytes()[i*16:])
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.WRID != uint64(i) || wc.ByteLen != 8 ||
			got != uint64(p.pi)<<32|uint64(i) {
			errs.add("pair %d: receive %d: %v, payload %#x", p.pi, i, wc, got)
		}
	}
}

// failures collects what goroutines of a case found wrong, for the case's goroutine to
// report (env's Errorf is not for other goroutines).
type failures struct {
	mu   sync.Mutex
	msgs []string
}

func (f *failures) add(format string, args ...any) {
	f.mu.Lock()
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

// report reports the first 20 failures, and how many more there were.
func (f *failures) report(e *env) {
	for i, msg := range f.msgs {
		if i == 20 {
			e.Errorf("... and %d more", len(f.msgs)-20)
			return
		}
		e.Errorf("%s", msg)
	}
}
