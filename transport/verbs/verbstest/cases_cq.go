package verbstest

import (
	"errors"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// Completion queues resized under load (ibv_resize_cq(3)). A device without it
// (verbs.ErrUnsupported) skips, saying so.
func cqCases() []testCase {
	return []testCase{
		{"C1", "resize_cq_keeps_completions", caseC1},
	}
}

// C1: a completion queue grown while completions are arriving keeps them all, in order,
// and then holds the new size; a size beyond the device's maximum is EINVAL and changes
// nothing.
func caseC1(e *env) {
	c, s := e.newHost("C"), e.newHost("S")
	scq := c.newCQ(8)
	qc := c.qp(qpOpt{scq: scq})
	qs := s.qp(qpOpt{})
	e.connect(qc, cm.DefaultParams(), qs, cm.DefaultParams())
	sbuf, cbuf := s.mr(4096, verbs.AccessLocalWrite), c.mr(4096, verbs.AccessLocalWrite)
	const n = 6
	var sends []verbs.SendWR
	var recvs []uint64
	for i := range n {
		recvs = append(recvs, e.newWRID())
		e.postRecv(qs, verbs.RecvWR{WRID: recvs[i], SGL: []verbs.SGE{verbs.SGEFor(sbuf, i*64, 64)}})
		cbuf.Bytes()[i*64] = byte('a' + i)
		sends = append(sends, verbs.SendWR{WRID: e.newWRID(), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEFor(cbuf, i*64, 1)}})
	}
	e.postSend(qc, sends[:n/2]...)
	e.pollN(s.rcq, n/2, "S's first receives") // their SENDs' completions are on their way
	err := verbs.ResizeCQ(scq, 512)
	if errors.Is(err, verbs.ErrUnsupported) {
		e.t.Skipf("%s cannot resize a CQ: %v", c.dev.Name(), err)
	}
	if err != nil {
		e.Fatalf("resize CQ 8 -> 512 with completions arriving: %v", err)
	}
	if got := scq.Cap(); got < 512 {
		e.Errorf("CQ resized to 512 reports Cap %d", got)
	}
	e.postSend(qc, sends[n/2:]...)
	got := e.pollN(scq, n, "C's SENDs across the resize")
	for i, wc := range got {
		e.checkWC("SEND", wc, qc, sends[i].WRID, verbs.WCSuccess, verbs.WCSend)
	}
	for i, wc := range e.pollN(s.rcq, n-n/2, "S's last receives") {
		if e.checkWC("receive", wc, qs, recvs[n/2+i], verbs.WCSuccess, verbs.WCRecv) {
			e.wantBytes("message", sbuf.Bytes()[(n/2+i)*64:][:1], []byte{byte('a' + n/2 + i)})
		}
	}
	if max := c.dev.Attr().MaxCQE; max > 0 {
		if err := verbs.ResizeCQ(scq, max+1); !errors.Is(err, verbs.ErrInvalid) {
			e.Errorf("resize CQ beyond the device's MaxCQE %d: %v, want EINVAL", max, err)
		}
		if got := scq.Cap(); got < 512 {
			e.Errorf("a refused resize left Cap %d, want at least 512", got)
		}
	}
}
