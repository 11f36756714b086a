package verbstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// Release order at cleanup: QPs first (they use CQs, the PD, SRQs, and type-2 windows are
// bound to them), then SRQs, windows (they pin regions), regions, mappings, CQs, PDs; the
// device last.
type rank int

const (
	rankQP rank = iota
	rankSRQ
	rankMW
	rankMR
	rankMem
	rankCQ
	rankParent // parent domains: after their objects, before their TD and PD
	rankTD
	rankPD
)

var rankNames = [...]string{"QP", "SRQ", "MW", "MR", "mapping", "CQ", "parent domain", "TD", "PD"}

// resource is one object a host created, released at the end of the case.
type resource struct {
	rank    rank
	seq     int
	desc    string
	obj     any
	release func() error
	done    bool
}

// host is one opened device with a PD and a send and a receive CQ, tracking every object
// created on it.
type host struct {
	e    *env
	name string
	dev  verbs.Device
	pd   verbs.PD
	scq  verbs.CQ // default send CQ of the host's QPs
	rcq  verbs.CQ // default receive CQ
	res  []*resource
	seq  int
}

// Default sizes. They are clamped to the device's limits.
const (
	defaultCQE      = 1024
	defaultSendWR   = 128
	defaultRecvWR   = 128
	defaultSGE      = 4
	defaultInline   = 64
	defaultMsgBytes = 64 << 10
)

// newHost opens a device through the fixture and allocates a PD and two CQs. Everything
// created on the host is released when the case ends, in dependency order, and every
// release must succeed.
func (e *env) newHost(name string) *host {
	e.t.Helper()
	dev := e.f.Open(e.t)
	if dev == nil {
		e.setupf("Fixture.Open returned a nil device")
	}
	h := &host{e: e, name: name, dev: dev}
	e.t.Cleanup(h.cleanup)
	pd, err := dev.AllocPD()
	if err != nil {
		e.setupf("%s: alloc PD: %v", name, err)
	}
	h.pd = pd
	h.track(rankPD, "PD", pd, pd.Dealloc)
	cqe := min(defaultCQE, max(dev.Attr().MaxCQE, 1))
	h.scq = h.newCQ(cqe)
	h.rcq = h.newCQ(cqe)
	return h
}

func (h *host) track(r rank, desc string, obj any, release func() error) {
	h.seq++
	h.res = append(h.res, &resource{rank: r, seq: h.seq, desc: desc, obj: obj, release: release})
}

func (h *host) cleanup() {
	t := h.e.t
	t.Helper()
	sort.SliceStable(h.res, func(i, j int) bool {
		a, b := h.res[i], h.res[j]
		if a.rank != b.rank {
			return a.rank < b.rank
		}
		return a.seq > b.seq // newest first within a rank
	})
	for _, r := range h.res {
		if r.done {
			continue
		}
		r.done = true
		if err := r.release(); err != nil {
			t.Errorf("cleanup of host %s: release %s %s: %v", h.name, rankNames[r.rank], r.desc, err)
		}
	}
	h.res = nil
	if err := h.dev.Close(); err != nil {
		t.Errorf("cleanup of host %s: close device %s: %v", h.name, h.dev.Name(), err)
	}
}

// find returns the tracked resource of obj.
func (h *host) find(obj any) *resource {
	for _, r := range h.res {
		if r.obj == obj {
			return r
		}
	}
	return nil
}

// free releases a tracked object now (Dealloc, Dereg, Destroy, Unmap) and returns the
// release's error; on success the cleanup no longer releases it.
func (h *host) free(obj any) error {
	h.e.t.Helper()
	r := h.find(obj)
	if r == nil || r.done {
		h.e.setupf("free of an object that is not tracked or already freed: %v", obj)
	}
	err := r.release()
	if err == nil {
		r.done = true
	}
	return err
}

// forget stops tracking obj: the case released it itself.
func (h *host) forget(obj any) {
	if r := h.find(obj); r != nil {
		r.done = true
	}
}

func (h *host) newPD() verbs.PD {
	h.e.t.Helper()
	pd, err := h.dev.AllocPD()
	if err != nil {
		h.e.setupf("%s: alloc PD: %v", h.name, err)
	}
	h.track(rankPD, "extra PD", pd, pd.Dealloc)
	return pd
}

func (h *host) newCQ(cqe int) verbs.CQ {
	h.e.t.Helper()
	cq, err := h.dev.CreateCQ(cqe)
	if err != nil {
		h.e.setupf("%s: create CQ of %d: %v", h.name, cqe, err)
	}
	if cq.Cap() < cqe {
		h.e.Errorf("%s: CQ created for %d entries reports Cap %d", h.name, cqe, cq.Cap())
	}
	h.track(rankCQ, fmt.Sprintf("CQ(%d)", cqe), cq, cq.Destroy)
	return cq
}

// mapMem maps n bytes with verbs.Map, unmapped at cleanup.
func (h *host) mapMem(n int) *verbs.Memory {
	h.e.t.Helper()
	m, err := verbs.Map(n, verbs.MapOptions{Shared: true}) // shared: the shm fabric places READs in it
	if err != nil {
		h.e.setupf("%s: map %d bytes: %v", h.name, n, err)
	}
	h.track(rankMem, fmt.Sprintf("mapping(%d)", n), m, m.Unmap)
	return m
}

// mr maps n bytes and registers them on the host's PD with the given access.
func (h *host) mr(n int, access verbs.Access) verbs.MR { return h.mrOn(h.pd, n, access) }

func (h *host) mrOn(pd verbs.PD, n int, access verbs.Access) verbs.MR {
	h.e.t.Helper()
	m := h.mapMem(n)
	mr, err := pd.RegMR(m.Bytes(), access)
	if err != nil {
		h.e.setupf("%s: reg MR of %d bytes %v: %v", h.name, n, access, err)
	}
	if got := mr.Addr(); got != verbs.AddrOf(m.Bytes()) {
		h.e.Errorf("%s: MR.Addr() = %#x, want the address of its bytes %#x", h.name, got, verbs.AddrOf(m.Bytes()))
	}
	if len(mr.Bytes()) != n || mr.Access() != access {
		h.e.Errorf("%s: MR reports %d bytes and %v, want %d and %v", h.name, len(mr.Bytes()), mr.Access(), n, access)
	}
	h.track(rankMR, fmt.Sprintf("MR(%d %v key %#x)", n, access, mr.LKey()), mr, mr.Dereg)
	return mr
}

// mw allocates a memory window of type t on the host's PD.
func (h *host) mw(t verbs.MWType) verbs.MW { return h.mwOn(h.pd, t) }

func (h *host) mwOn(pd verbs.PD, t verbs.MWType) verbs.MW {
	h.e.t.Helper()
	w, err := pd.AllocMW(t)
	if err != nil {
		h.e.setupf("%s: alloc %v MW: %v", h.name, t, err)
	}
	if w.Type() != t {
		h.e.Errorf("%s: MW allocated as %v reports %v", h.name, t, w.Type())
	}
	h.track(rankMW, fmt.Sprintf("%v MW(key %#x)", t, w.RKey()), w, w.Dealloc)
	return w
}

// qpOpt tunes host.qp. Zero fields take the host's defaults.
type qpOpt struct {
	pd       verbs.PD
	typ      verbs.QPType
	scq, rcq verbs.CQ
	cap      verbs.QPCap
	sigAll   bool
	srq      verbs.SRQ // receives come from this shared receive queue
}

// qp creates a queue pair (in RESET), destroyed at cleanup.
func (h *host) qp(o qpOpt) verbs.QP {
	h.e.t.Helper()
	a := h.dev.Attr()
	clamp := func(v, def, lim int) int {
		if v == 0 {
			v = def
		}
		if lim > 0 && v > lim {
			v = lim
		}
		return v
	}
	attr := verbs.QPInitAttr{
		Type: o.typ, SendCQ: o.scq, RecvCQ: o.rcq, SigAll: o.sigAll,
		Cap: verbs.QPCap{
			MaxSendWR:     clamp(o.cap.MaxSendWR, defaultSendWR, a.MaxQPWR),
			MaxRecvWR:     clamp(o.cap.MaxRecvWR, defaultRecvWR, a.MaxQPWR),
			MaxSendSGE:    clamp(o.cap.MaxSendSGE, defaultSGE, a.MaxSGE),
			MaxRecvSGE:    clamp(o.cap.MaxRecvSGE, defaultSGE, a.MaxSGE),
			MaxInlineData: clamp(o.cap.MaxInlineData, defaultInline, a.MaxInlineData),
		},
	}
	if attr.Type == 0 {
		attr.Type = verbs.QPTypeRC
	}
	if o.srq != nil {
		attr.SRQ = o.srq
		attr.Cap.MaxRecvWR, attr.Cap.MaxRecvSGE = 0, 0
	}
	if attr.SendCQ == nil {
		attr.SendCQ = h.scq
	}
	if attr.RecvCQ == nil {
		attr.RecvCQ = h.rcq
	}
	pd := o.pd
	if pd == nil {
		pd = h.pd
	}
	qp, err := pd.CreateQP(attr)
	if err != nil {
		h.e.setupf("%s: create QP %+v: %v", h.name, attr.Cap, err)
	}
	if s := qp.State(); s != verbs.QPStateReset {
		h.e.Errorf("%s: new QP %d is in %v, want RESET", h.name, qp.Num(), s)
	}
	c := qp.Cap()
	if c.MaxSendWR < attr.Cap.MaxSendWR || c.MaxRecvWR < attr.Cap.MaxRecvWR || c.MaxSendSGE < attr.Cap.MaxSendSGE ||
		c.MaxRecvSGE < attr.Cap.MaxRecvSGE || c.MaxInlineData < attr.Cap.MaxInlineData {
		h.e.Errorf("%s: QP %d reports Cap %+v, less than the %+v asked for", h.name, qp.Num(), c, attr.Cap)
	}
	if o.srq != nil && (c.MaxRecvWR != 0 || c.MaxRecvSGE != 0) {
		h.e.Errorf("%s: QP %d on an SRQ reports receive capacities %d/%d, want 0 (it has no receive queue)", h.name, qp.Num(), c.MaxRecvWR, c.MaxRecvSGE)
	}
	h.track(rankQP, fmt.Sprintf("QP %d", qp.Num()), qp, qp.Destroy)
	return qp
}

// srq creates a shared receive queue on the host's PD, destroyed at cleanup after the
// QPs. A device without SRQs fails the case's setup, saying so.
func (h *host) srq(a verbs.SRQAttr) verbs.SRQ {
	h.e.t.Helper()
	if n := h.dev.Attr().MaxSRQ; n == 0 {
		h.e.setupf("%s: device %s reports MaxSRQ 0: the SRQ cases need shared receive queues", h.name, h.dev.Name())
	}
	s, err := verbs.CreateSRQ(h.pd, a)
	if err != nil {
		h.e.setupf("%s: create SRQ %+v: %v", h.name, a, err)
	}
	if c := s.Cap(); c.MaxWR < a.MaxWR || c.MaxSGE < a.MaxSGE {
		h.e.Errorf("%s: SRQ reports Cap %+v, less than the %+v asked for", h.name, c, a)
	}
	if s.PD() != h.pd {
		h.e.Errorf("%s: SRQ.PD() is not the PD it was created on", h.name)
	}
	h.track(rankSRQ, fmt.Sprintf("SRQ(%d)", a.MaxWR), s, s.Destroy)
	return s
}

// needsStream reports whether qp's provider carries its traffic over the connection cm
// hands it.
func needsStream(qp verbs.QP) bool {
	sq, ok := qp.(verbs.StreamQP)
	return ok && sq.NeedsStream()
}

// connect connects a (with parameters pa) and b (with pb), both in RESET or INIT, with
// cm.Connect over a fresh loopback TCP connection (or Fixture.Pipe's pair), both sides at once, within the
// fixture's timeout. A QP whose provider takes the stream owns its end of the connection;
// otherwise the end is closed once the QPs are connected.
func (e *env) connect(a verbs.QP, pa cm.Params, b verbs.QP, pb cm.Params) {
	e.t.Helper()
	var ca, cb net.Conn
	if e.f.Pipe != nil {
		ca, cb = e.f.Pipe(e.t)
	} else {
		ca, cb = e.tcpPipe()
	}
	e.connectOver(ca, a, pa, cb, b, pb)
}

// tcpPipe returns the two ends of a fresh loopback TCP connection.
func (e *env) tcpPipe() (net.Conn, net.Conn) {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.setupf("listen: %v", err)
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	ach := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ach <- accepted{c, err}
	}()
	dialer := net.Dialer{Timeout: e.timeout}
	ca, err := dialer.Dial("tcp", ln.Addr().String())
	if err != nil {
		_ = ln.Close()
		if x := <-ach; x.c != nil {
			_ = x.c.Close()
		}
		e.setupf("dial %v: %v", ln.Addr(), err)
	}
	var cb net.Conn
	select {
	case x := <-ach:
		cb, err = x.c, x.err
	case <-time.After(e.timeout):
		err = fmt.Errorf("no connection accepted within %v", e.timeout)
		_ = ln.Close()
		if x := <-ach; x.c != nil {
			_ = x.c.Close()
		}
	}
	_ = ln.Close()
	if err != nil {
		_ = ca.Close()
		e.setupf("accept: %v", err)
	}
	return ca, cb
}

// connectOver runs cm.Connect for a over ca and for b over cb, both at once.
func (e *env) connectOver(ca net.Conn, a verbs.QP, pa cm.Params, cb net.Conn, b verbs.QP, pb cm.Params) {
	e.t.Helper()
	ownA, ownB := needsStream(a), needsStream(b)
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	errb := make(chan error, 1)
	go func() {
		_, err := cm.Connect(ctx, cb, b, pb)
		errb <- err
	}()
	_, errA := cm.Connect(ctx, ca, a, pa)
	errB := <-errb
	if errA != nil || errB != nil {
		// On failure close both ends whoever owns them, so that no provider goroutine is
		// left reading a live stream (a second Close of a conn is harmless).
		_ = ca.Close()
		_ = cb.Close()
		e.setupf("cm.Connect QP %d <-> QP %d: %v / %v", a.Num(), b.Num(), errA, errB)
	}
	if !ownA {
		_ = ca.Close()
	}
	if !ownB {
		_ = cb.Close()
	}
	for _, q := range []verbs.QP{a, b} {
		if s := q.State(); s != verbs.QPStateRTS {
			e.setupf("QP %d is in %v after cm.Connect, want RTS", q.Num(), s)
		}
	}
}

// rig is the standard two-host setup: C (memory owner, window binder) and S (reader),
// one connected QP each, with registered memory on both sides.
type rig struct {
	e      *env
	c, s   *host
	qc, qs verbs.QP
	pc, ps cm.Params

	win     verbs.MR // C: the memory windows are bound over (pattern-filled)
	cmsg    verbs.MR // C: send sources [0, half) and receive buffers [half, end)
	smsg    verbs.MR // S: the same
	readBuf verbs.MR // S: READ targets, as large as win

	keys map[verbs.MW]uint32 // the current rkey of each type-2 window the rig bound
	srq  verbs.SRQ           // C's shared receive queue (rigOpt.srq), which recvC posts to

	sl *slots // shared by the rigs of newPair
}

// slots are bump offsets inside the halves of cmsg and smsg.
type slots struct{ cSend, cRecv, sSend, sRecv int }

// rigOpt tunes newRig. Zero fields take the defaults.
type rigOpt struct {
	pc, ps    *cm.Params   // connection parameters of C and S (cm.DefaultParams)
	winAccess verbs.Access // access of win (LOCAL_WRITE|MW_BIND)
	winSize   int          // bytes of win (64 KiB)
	ccap      verbs.QPCap  // C's QP capacities
	scap      verbs.QPCap  // S's QP capacities
	srq       bool         // C's QPs take their receives from an SRQ (rig.srq)
}

const defaultWinAccess = verbs.AccessLocalWrite | verbs.AccessMWBind

func (e *env) newRig(o rigOpt) *rig {
	e.t.Helper()
	r := &rig{e: e, keys: make(map[verbs.MW]uint32), pc: cm.DefaultParams(), ps: cm.DefaultParams(), sl: new(slots)}
	if o.pc != nil {
		r.pc = *o.pc
	}
	if o.ps != nil {
		r.ps = *o.ps
	}
	if o.winAccess == 0 {
		o.winAccess = defaultWinAccess
	}
	if o.winSize == 0 {
		o.winSize = 64 << 10
	}
	r.c = e.newHost("C")
	r.s = e.newHost("S")
	r.win = r.c.mr(o.winSize, o.winAccess)
	fillPattern(r.win.Bytes(), 1)
	r.cmsg = r.c.mr(defaultMsgBytes, verbs.AccessLocalWrite)
	r.smsg = r.s.mr(defaultMsgBytes, verbs.AccessLocalWrite)
	r.readBuf = r.s.mr(o.winSize, verbs.AccessLocalWrite)
	if o.srq {
		r.srq = r.c.srq(verbs.SRQAttr{MaxWR: defaultRecvWR, MaxSGE: defaultSGE})
	}
	r.qc = r.c.qp(qpOpt{cap: o.ccap, srq: r.srq})
	r.qs = r.s.qp(qpOpt{cap: o.scap})
	e.connect(r.qc, r.pc, r.qs, r.ps)
	return r
}

// newPair connects one more QP on C and one on S (with the rig's parameters) and returns
// a rig that shares the hosts and memory of r but uses the new QPs.
func (r *rig) newPair() *rig {
	r.e.t.Helper()
	n := *r
	n.keys = make(map[verbs.MW]uint32)
	n.qc = r.c.qp(qpOpt{srq: r.srq})
	n.qs = r.s.qp(qpOpt{})
	r.e.connect(n.qc, r.pc, n.qs, r.ps)
	return &n
}

// fillPattern fills b with a position-dependent pattern distinct for each seed.
func fillPattern(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*131 + (i>>8)*7 + seed*29 + 1)
	}
}

// winAddr returns the virtual address of byte off of win.
func (r *rig) winAddr(off int) uint64 { return r.win.Addr() + uint64(off) }

// slot hands out n bytes of a half of a message buffer, wrapping around.
func slot(pos *int, n, base, size int) int {
	if n > size {
		panic(fmt.Sprintf("verbstest: %d-byte slot in a %d-byte area", n, size))
	}
	if *pos+n > size {
		*pos = 0
	}
	off := base + *pos
	*pos += (n + 63) &^ 63
	return off
}

// cSendSlot and friends return offsets into cmsg and smsg.
func (r *rig) cSendSlot(n int) int { return slot(&r.sl.cSend, n, 0, defaultMsgBytes/2) }
func (r *rig) cRecvSlot(n int) int {
	return slot(&r.sl.cRecv, n, defaultMsgBytes/2, defaultMsgBytes/2)
}
func (r *rig) sSendSlot(n int) int { return slot(&r.sl.sSend, n, 0, defaultMsgBytes/2) }
func (r *rig) sRecvSlot(n int) int {
	return slot(&r.sl.sRecv, n, defaultMsgBytes/2, defaultMsgBytes/2)
}

// recv is a posted receive: its WRID and where its bytes land.
type recv struct {
	wrid uint64
	mr   verbs.MR
	off  int
	n    int
}

func (v recv) bytes() []byte { return v.mr.Bytes()[v.off : v.off+v.n] }

// postRecv posts one n-byte receive on qp from the given message buffer.
func (r *rig) postRecv(qp verbs.QP, mr verbs.MR, off, n int) recv {
	r.e.t.Helper()
	v := recv{wrid: r.e.newWRID(), mr: mr, off: off, n: n}
	clear(v.bytes())
	r.e.postRecv(qp, verbs.RecvWR{WRID: v.wrid, SGL: []verbs.SGE{verbs.SGEFor(mr, off, n)}})
	return v
}

// postSRQRecv posts one n-byte receive to srq from the given message buffer.
func (r *rig) postSRQRecv(srq verbs.SRQ, mr verbs.MR, off, n int) recv {
	r.e.t.Helper()
	v := recv{wrid: r.e.newWRID(), mr: mr, off: off, n: n}
	clear(v.bytes())
	r.e.postSRQRecv(srq, verbs.RecvWR{WRID: v.wrid, SGL: []verbs.SGE{verbs.SGEFor(mr, off, n)}})
	return v
}

// recvC posts an n-byte receive on C's QP (to C's SRQ, if the rig has one); recvS on S's.
func (r *rig) recvC(n int) recv {
	if r.srq != nil {
		return r.postSRQRecv(r.srq, r.cmsg, r.cRecvSlot(n), n)
	}
	return r.postRecv(r.qc, r.cmsg, r.cRecvSlot(n), n)
}
func (r *rig) recvS(n int) recv { return r.postRecv(r.qs, r.smsg, r.sRecvSlot(n), n) }

// sendWR builds a signaled send-type work request carrying payload from mr at off (the
// payload is copied there first).
func (r *rig) sendWR(op verbs.WROpcode, mr verbs.MR, off int, payload []byte) verbs.SendWR {
	copy(mr.Bytes()[off:], payload)
	wr := verbs.SendWR{WRID: r.e.newWRID(), Opcode: op, Flags: verbs.SendSignaled}
	if len(payload) > 0 {
		wr.SGL = []verbs.SGE{verbs.SGEFor(mr, off, len(payload))}
	}
	return wr
}

// sWR builds a signaled send-type WR on S carrying payload; cWR on C.
func (r *rig) sWR(op verbs.WROpcode, payload []byte) verbs.SendWR {
	return r.sendWR(op, r.smsg, r.sSendSlot(max(len(payload), 1)), payload)
}
func (r *rig) cWR(op verbs.WROpcode, payload []byte) verbs.SendWR {
	return r.sendWR(op, r.cmsg, r.cSendSlot(max(len(payload), 1)), payload)
}

// bindWR builds a signaled BIND_MW of mw with rkey key over [off, off+n) of mr.
func (r *rig) bindWR(mw verbs.MW, key uint32, mr verbs.MR, off, n int, access verbs.Access) verbs.SendWR {
	addr := mr.Addr() + uint64(off)
	return verbs.SendWR{WRID: r.e.newWRID(), Opcode: verbs.WRBindMW, Flags: verbs.SendSignaled,
		Bind: verbs.MWBind{MW: mw, RKey: key, MR: mr, Addr: addr, Length: uint64(n), Access: access}}
}

// curKey returns the rkey the rig last bound mw with, or its allocation key.
func (r *rig) curKey(mw verbs.MW) uint32 {
	if k, ok := r.keys[mw]; ok {
		return k
	}
	return mw.RKey()
}

// bind binds the type-2 window mw over [off, off+n) of win through C's QP with the next
// rkey (IncRkey of the current one), waits for its SUCCESS completion and returns the key.
func (r *rig) bind(mw verbs.MW, off, n int, access verbs.Access) uint32 {
	r.e.t.Helper()
	return r.bindOn(r.qc, mw, r.win, off, n, access)
}

// bindOn binds through qp, one of C's QPs on C's default CQs.
func (r *rig) bindOn(qp verbs.QP, mw verbs.MW, mr verbs.MR, off, n int, access verbs.Access) uint32 {
	r.e.t.Helper()
	key := verbs.IncRkey(r.curKey(mw))
	wr := r.bindWR(mw, key, mr, off, n, access)
	r.e.postSend(qp, wr)
	wc := r.e.poll1(r.c.scq, "BIND_MW")
	if !r.e.checkWC("BIND_MW", wc, qp, wr.WRID, verbs.WCSuccess, verbs.WCBindMW) {
		r.e.Fatalf("cannot go on without the window")
	}
	r.keys[mw] = key
	return key
}

// readWR builds a signaled READ of n bytes at raddr with key into readBuf at loff.
func (r *rig) readWR(key uint32, raddr uint64, n, loff int) verbs.SendWR {
	wr := verbs.SendWR{WRID: r.e.newWRID(), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		RemoteAddr: raddr, RKey: key}
	if n > 0 {
		wr.SGL = []verbs.SGE{verbs.SGEFor(r.readBuf, loff, n)}
	}
	return wr
}

// readOK READs n bytes at raddr through S's QP with key and checks that the completion is
// SUCCESS and that the bytes equal win[woff:woff+n].
func (r *rig) readOK(key uint32, raddr uint64, n, woff int) {
	r.e.t.Helper()
	r.readOKOn(r.qs, key, raddr, n, woff)
}

func (r *rig) readOKOn(qs verbs.QP, key uint32, raddr uint64, n, woff int) {
	r.e.t.Helper()
	clear(r.readBuf.Bytes()[:n])
	wr := r.readWR(key, raddr, n, 0)
	r.e.postSend(qs, wr)
	wc := r.e.poll1(r.s.scq, "READ")
	what := fmt.Sprintf("READ of %d bytes at %#x with rkey %#x", n, raddr, key)
	if !r.e.checkWC(what, wc, qs, wr.WRID, verbs.WCSuccess, verbs.WCRDMARead) {
		r.e.Fatalf("cannot go on")
	}
	if wc.ByteLen != uint32(n) {
		r.e.Errorf("%s: byte_len %d, want %d", what, wc.ByteLen, n)
	}
	r.e.wantBytes(what, r.readBuf.Bytes()[:n], r.win.Bytes()[woff:woff+n])
}

// expectRemoteAccessErr is the R2 expectation: S posts a READ with a key the responder
// must refuse, then a second READ and a SEND; the first completes REM_ACCESS_ERR, the
// others WR_FLUSH_ERR, both QPs end in ERR, and the receive C had posted flushes.
func (r *rig) expectRemoteAccessErr(key uint32, raddr uint64, n int) {
	r.e.t.Helper()
	r.expectRemoteErr(verbs.WCRemAccessErr, key, raddr, n)
}

func (r *rig) expectRemoteErr(st verbs.WCStatus, key uint32, raddr uint64, n int) {
	r.e.t.Helper()
	rv := r.recvC(64) // for the SEND, should it ever arrive
	w1 := r.readWR(key, raddr, n, 0)
	w2 := r.readWR(key, raddr, n, 0)
	w3 := r.sWR(verbs.WRSend, []byte("after the error"))
	r.e.postSend(r.qs, w1, w2, w3)
	wcs := r.e.pollN(r.s.scq, 3, "READ, READ, SEND after a refused READ")
	what := fmt.Sprintf("READ of %d bytes at %#x with rkey %#x", n, raddr, key)
	r.e.checkWC(what, wcs[0], r.qs, w1.WRID, st, verbs.WCRDMARead)
	r.e.checkWC("READ posted after it", wcs[1], r.qs, w2.WRID, verbs.WCWRFlushErr, 0)
	r.e.checkWC("SEND posted after it", wcs[2], r.qs, w3.WRID, verbs.WCWRFlushErr, 0)
	r.e.waitState(r.qs, verbs.QPStateError, "S's QP after the refused READ")
	if r.e.waitState(r.qc, verbs.QPStateError, "C's QP after refusing the READ") {
		rc := r.e.poll1(r.c.rcq, "C's posted receive")
		r.e.checkWC("C's receive posted before the error", rc, r.qc, rv.wrid, verbs.WCWRFlushErr, 0)
	}
}

// errIs reports whether err matches target, failing the case with a message otherwise.
func (e *env) errIs(what string, err, target error) bool {
	e.t.Helper()
	if !errors.Is(err, target) {
		e.Errorf("%s: error %v, want one matching %q", what, err, target)
		return false
	}
	return true
}

// postErrIndex checks that err is a *verbs.PostError for request index i.
func (e *env) postErrIndex(what string, err error, i int) {
	e.t.Helper()
	var pe *verbs.PostError
	if !errors.As(err, &pe) {
		e.Errorf("%s: error %v (%T) is not a *verbs.PostError", what, err, err)
		return
	}
	if pe.Index != i {
		e.Errorf("%s: PostError.Index %d, want %d", what, pe.Index, i)
	}
}
