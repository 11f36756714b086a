package verbstest

import (
	"fmt"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

func dataCases() []testCase {
	return []testCase{
		{"D1", "send_recv_sges", caseD1},
		{"D2", "send_with_imm", caseD2},
		{"D3", "rdma_write", caseD3},
		{"D4", "rdma_write_with_imm", caseD4},
		{"D5", "cq_notify", caseD5},
		{"D6", "type1_bind_read", caseD6},
	}
}

// D1: SEND with three SGEs into a receive with two: the message is gathered in order,
// scattered in order, byte_len is its length; messages arrive in order, each in the next
// posted receive.
func caseD1(e *env) {
	r := e.newRig(rigOpt{})
	msg := make([]byte, 60)
	fillPattern(msg, 5)
	// Gather from three separate places of S's buffer.
	offs := []int{r.sSendSlot(10), r.sSendSlot(20), r.sSendSlot(30)}
	b := r.smsg.Bytes()
	copy(b[offs[0]:], msg[:10])
	copy(b[offs[1]:], msg[10:30])
	copy(b[offs[2]:], msg[30:])
	// Scatter into two separate places of C's buffer.
	ro := []int{r.cRecvSlot(32), r.cRecvSlot(64)}
	cb := r.cmsg.Bytes()
	clear(cb[ro[0] : ro[0]+32])
	clear(cb[ro[1] : ro[1]+64])
	rwrid := e.newWRID()
	e.postRecv(r.qc, verbs.RecvWR{WRID: rwrid, SGL: []verbs.SGE{verbs.SGEFor(r.cmsg, ro[0], 32), verbs.SGEFor(r.cmsg, ro[1], 64)}})
	wr := verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{
		verbs.SGEFor(r.smsg, offs[0], 10), verbs.SGEFor(r.smsg, offs[1], 20), verbs.SGEFor(r.smsg, offs[2], 30)}}
	e.postSend(r.qs, wr)
	wc := e.poll1(r.s.scq, "SEND")
	e.checkWC("3-SGE SEND", wc, r.qs, wr.WRID, verbs.WCSuccess, verbs.WCSend)
	rc := e.poll1(r.c.rcq, "receive")
	if e.checkWC("2-SGE receive", rc, r.qc, rwrid, verbs.WCSuccess, verbs.WCRecv) {
		if rc.ByteLen != 60 {
			e.Errorf("receive byte_len %d, want 60", rc.ByteLen)
		}
		if rc.Flags&(verbs.WCWithImm|verbs.WCWithInv) != 0 {
			e.Errorf("plain SEND received with flags %v", rc)
		}
		e.wantBytes("first receive SGE", cb[ro[0]:ro[0]+32], msg[:32])
		e.wantBytes("second receive SGE", cb[ro[1]:ro[1]+28], msg[32:])
		e.wantBytes("rest of the second SGE (untouched)", cb[ro[1]+28:ro[1]+64], make([]byte, 36))
	}

	// Several messages, including an empty one: in order, one receive each.
	const k = 5
	var rvs [k]recv
	var wrs [k]verbs.SendWR
	for i := range k {
		rvs[i] = r.recvC(128)
		wrs[i] = r.sWR(verbs.WRSend, []byte(fmt.Sprintf("message %d %s", i, "xxxxxxxxxxxxxxxxxxxxxxx"[:i*4])))
	}
	wrs[2] = r.sWR(verbs.WRSend, nil) // zero-length SEND
	e.postSend(r.qs, wrs[:]...)
	wcs := e.pollN(r.s.scq, k, "SENDs")
	rcs := e.pollN(r.c.rcq, k, "receives")
	for i := range k {
		e.checkWC(fmt.Sprintf("SEND %d", i), wcs[i], r.qs, wrs[i].WRID, verbs.WCSuccess, verbs.WCSend)
		if !e.checkWC(fmt.Sprintf("receive %d", i), rcs[i], r.qc, rvs[i].wrid, verbs.WCSuccess, verbs.WCRecv) {
			continue
		}
		var want []byte
		if len(wrs[i].SGL) > 0 {
			s := wrs[i].SGL[0]
			want = r.smsg.Bytes()[s.Addr-r.smsg.Addr():][:s.Length]
		}
		if rcs[i].ByteLen != uint32(len(want)) {
			e.Errorf("receive %d: byte_len %d, want %d", i, rcs[i].ByteLen, len(want))
		}
		e.wantBytes(fmt.Sprintf("message %d", i), rvs[i].bytes()[:len(want)], want)
	}
}

// D2: SEND_WITH_IMM: the receive has WITH_IMM and the immediate; a plain SEND after it
// does not.
func caseD2(e *env) {
	r := e.newRig(rigOpt{})
	rv1, rv2 := r.recvC(64), r.recvC(64)
	w1 := r.sWR(verbs.WRSendWithImm, []byte("with imm"))
	w1.ImmData = 0xCAFEBABE
	w2 := r.sWR(verbs.WRSend, []byte("without"))
	w2.ImmData = 0x1111 // ignored for SEND
	e.postSend(r.qs, w1, w2)
	wcs := e.pollN(r.s.scq, 2, "SENDs")
	e.checkWC("SEND_WITH_IMM", wcs[0], r.qs, w1.WRID, verbs.WCSuccess, verbs.WCSend)
	e.checkWC("SEND", wcs[1], r.qs, w2.WRID, verbs.WCSuccess, verbs.WCSend)
	rcs := e.pollN(r.c.rcq, 2, "receives")
	if e.checkWC("receive of SEND_WITH_IMM", rcs[0], r.qc, rv1.wrid, verbs.WCSuccess, verbs.WCRecv) {
		if rcs[0].Flags&verbs.WCWithImm == 0 || rcs[0].ImmData != 0xCAFEBABE {
			e.Errorf("receive of SEND_WITH_IMM: %v, want WITH_IMM imm=0xcafebabe", rcs[0])
		}
		if rcs[0].ByteLen != 8 {
			e.Errorf("receive of SEND_WITH_IMM: byte_len %d, want 8", rcs[0].ByteLen)
		}
		e.wantBytes("SEND_WITH_IMM payload", rv1.bytes()[:8], []byte("with imm"))
	}
	if e.checkWC("receive of SEND", rcs[1], r.qc, rv2.wrid, verbs.WCSuccess, verbs.WCRecv) && rcs[1].Flags&verbs.WCWithImm != 0 {
		e.Errorf("receive of a plain SEND: %v has WITH_IMM", rcs[1])
	}
}

// D3: RDMA WRITE through the MR's rkey and through a type-2 window with REMOTE_WRITE: the
// data lands, and no receive is consumed (the next SEND takes the receive posted first).
func caseD3(e *env) {
	r := e.newRig(rigOpt{winAccess: defaultWinAccess | rw})
	rv := r.recvC(64)
	data := make([]byte, 300)
	fillPattern(data, 7)
	wr := r.sWR(verbs.WRRDMAWrite, data)
	wr.RemoteAddr, wr.RKey = r.winAddr(1000), r.win.RKey()
	e.postSend(r.qs, wr)
	wc := e.poll1(r.s.scq, "WRITE")
	if e.checkWC("RDMA WRITE with the MR's rkey", wc, r.qs, wr.WRID, verbs.WCSuccess, verbs.WCRDMAWrite) {
		e.wantBytes("written data", r.win.Bytes()[1000:1300], data)
	}
	mw := r.c.mw(verbs.MWType2)
	k := r.bind(mw, 8192, 4096, rw)
	data2 := make([]byte, 100)
	fillPattern(data2, 8)
	wr2 := r.sWR(verbs.WRRDMAWrite, data2)
	wr2.RemoteAddr, wr2.RKey = r.winAddr(8192+50), k
	e.postSend(r.qs, wr2)
	wc = e.poll1(r.s.scq, "WRITE through a window")
	if e.checkWC("RDMA WRITE through a type-2 window", wc, r.qs, wr2.WRID, verbs.WCSuccess, verbs.WCRDMAWrite) {
		e.wantBytes("data written through the window", r.win.Bytes()[8242:8342], data2)
	}
	e.expectNoWC(r.c.rcq, quiet, "C's receive CQ (WRITE consumes no receive)")
	sw := r.sWR(verbs.WRSend, []byte("now a SEND"))
	e.postSend(r.qs, sw)
	e.checkWC("SEND", e.poll1(r.s.scq, "SEND"), r.qs, sw.WRID, verbs.WCSuccess, verbs.WCSend)
	e.checkWC("receive posted before the WRITEs", e.poll1(r.c.rcq, "receive"), r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv)
}

// D4: RDMA WRITE_WITH_IMM consumes a receive, which completes as RECV_RDMA_WITH_IMM with
// WITH_IMM, the immediate and byte_len the length written.
func caseD4(e *env) {
	r := e.newRig(rigOpt{winAccess: defaultWinAccess | rw})
	rv := r.recvC(64)
	data := make([]byte, 200)
	fillPattern(data, 9)
	wr := r.sWR(verbs.WRRDMAWriteWithImm, data)
	wr.RemoteAddr, wr.RKey, wr.ImmData = r.winAddr(2000), r.win.RKey(), 0x1234
	e.postSend(r.qs, wr)
	e.checkWC("WRITE_WITH_IMM", e.poll1(r.s.scq, "WRITE_WITH_IMM"), r.qs, wr.WRID, verbs.WCSuccess, verbs.WCRDMAWrite)
	rc := e.poll1(r.c.rcq, "receive consumed by WRITE_WITH_IMM")
	if e.checkWC("receive consumed by WRITE_WITH_IMM", rc, r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecvRDMAWithImm) {
		if rc.Flags&verbs.WCWithImm == 0 || rc.ImmData != 0x1234 {
			e.Errorf("WRITE_WITH_IMM receive: %v, want WITH_IMM imm=0x1234", rc)
		}
		if rc.ByteLen != 200 {
			e.Errorf("WRITE_WITH_IMM receive: byte_len %d, want 200 (the bytes written)", rc.ByteLen)
		}
	}
	e.wantBytes("written data", r.win.Bytes()[2000:2200], data)
	e.wantBytes("receive buffer (untouched by a WRITE)", rv.bytes(), make([]byte, 64))
}

// D5: an armed CQ signals its channel on the next completion.
func caseD5(e *env) {
	r := e.newRig(rigOpt{})
	for _, side := range []struct {
		name string
		cq   verbs.CQ
	}{{"S's send CQ", r.s.scq}, {"C's receive CQ", r.c.rcq}} {
		select {
		case <-side.cq.Notify():
		default:
		}
		if err := side.cq.ReqNotify(); err != nil {
			e.Fatalf("%s: ReqNotify: %v", side.name, err)
		}
		rv := r.recvC(64)
		wr := r.sWR(verbs.WRSend, []byte("notify"))
		e.postSend(r.qs, wr)
		select {
		case <-side.cq.Notify():
		case <-time.After(e.timeout):
			e.Errorf("%s: armed, no event within %v", side.name, e.timeout)
		}
		e.checkWC("SEND", e.poll1(r.s.scq, "SEND"), r.qs, wr.WRID, verbs.WCSuccess, verbs.WCSend)
		e.checkWC("receive", e.poll1(r.c.rcq, "receive"), r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv)
	}
	// Not armed: no event.
	rv := r.recvC(64)
	wr := r.sWR(verbs.WRSend, []byte("quiet"))
	e.postSend(r.qs, wr)
	e.checkWC("SEND", e.poll1(r.s.scq, "SEND"), r.qs, wr.WRID, verbs.WCSuccess, verbs.WCSend)
	e.checkWC("receive", e.poll1(r.c.rcq, "receive"), r.qc, rv.wrid, verbs.WCSuccess, verbs.WCRecv)
	select {
	case <-r.s.scq.Notify():
		e.Errorf("S's send CQ signalled an event without ReqNotify")
	case <-time.After(quiet):
	}
}

// D6: a type-1 window bound with MW.Bind serves READs through any QP of its PD; binding it
// again moves it (and its rkey): the old rkey is refused.
func caseD6(e *env) {
	r := e.newRig(rigOpt{})
	w := r.c.mw(verbs.MWType1)
	k1 := r.bindType1(w, 0, 4096, rr)
	r.readOK(k1, r.winAddr(100), 1000, 100)
	k2 := r.bindType1(w, 8192, 4096, rr)
	r.readOK(k2, r.winAddr(8192), 4096, 8192)
	r.expectRemoteAccessErr(k1, r.winAddr(100), 64)
}
