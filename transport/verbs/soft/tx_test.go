package soft

import (
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestPosterLeavesToHolder: a poster that finds another goroutine transmitting leaves its
// work requests to that one and wakes no engine; the holder is asked for another round
// when it lets go, and only then.
func TestPosterLeavesToHolder(t *testing.T) {
	q := bareQP()
	q.wake = make(chan struct{}, 1)
	if !q.takeTx() {
		t.Fatal("takeTx failed with txMu free")
	}
	if q.letGoTx() {
		t.Fatal("letGoTx asked for another round though no poster came")
	}

	q.txMu.Lock() // another goroutine transmits
	q.transmitInline(nil, postPlain)
	if len(q.wake) != 0 {
		t.Fatal("a poster that found txMu held woke the engine")
	}
	if !q.letGoTx() {
		t.Fatal("the holder was not asked for another round after a poster found txMu held")
	}
	if !q.takeTx() || q.letGoTx() {
		t.Fatal("the next holder's round did not clear the request")
	}
}

// TestReaderLeavesToHolder: a reader whose delivery leaves the QP work to transmit wakes
// the engine only while nobody transmits: a goroutine that holds txMu is asked for another
// round instead.
func TestReaderLeavesToHolder(t *testing.T) {
	q := bareQP()
	q.wake = make(chan struct{}, 1)
	q.outq = append(q.outq, outFrame{h: header{op: opAck}}) // work for whoever transmits

	q.txMu.Lock() // a poster transmits
	q.mu.Lock()
	q.unlockAndKick()
	if len(q.wake) != 0 {
		t.Fatal("the reader woke the engine while a poster held txMu")
	}
	if !q.letGoTx() {
		t.Fatal("the holder was not asked for another round")
	}

	q.mu.Lock()
	q.unlockAndKick()
	if len(q.wake) != 1 {
		t.Fatal("with nobody transmitting, the reader did not wake the engine for the work it left")
	}
}

// TestHeldResponsesGathered: requests that arrive together (one BATCH, one read) and are
// answered from the armed queue's handler with PostSendHeld leave in one or two writes,
// not one each. (With PostSend, logged for comparison, each answer is written at once.)
func TestHeldResponsesGathered(t *testing.T) {
	const n = 16
	for _, held := range []bool{true, false} {
		t.Run(map[bool]string{true: "held", false: "not held"}[held], func(t *testing.T) {
			open := fabrics(t)["tcp"]
			c, s := newHost(t, open("c"), 1<<16), newHost(t, open("s"), 1<<16)
			defer c.close(t)
			defer s.close(t)
			connect(t, c, s)
			for i := 0; i < n; i++ {
				must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(s.mr, 64*i, 64)}}}))
				must(t, c.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(c.mr, 4096+64*i, 64)}}}))
			}
			sq := s.qp.(*QP)
			answer := func(wc *verbs.WorkCompletion) {
				if wc.Opcode != verbs.WCRecv {
					return
				}
				wr := []verbs.SendWR{{WRID: wc.WRID, Opcode: verbs.WRSend, Flags: verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 64*int(wc.WRID), 8)}}}
				if held {
					must(t, sq.PostSendHeld(wr))
				} else {
					must(t, sq.PostSend(wr))
				}
			}
			reapInline(t, s.cq, answer)

			wrs := make([]verbs.SendWR, n) // one PostSend: one BATCH on the stream
			for i := range wrs {
				wrs[i] = verbs.SendWR{WRID: uint64(100 + i), Opcode: verbs.WRSend, Flags: verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 8)}}
			}
			before := s.dev.Stats().Writes
			must(t, c.qp.PostSend(wrs))
			for got := 0; got < n; {
				if wc := c.poll(t); wc.Opcode == verbs.WCRecv {
					if wc.Status != verbs.WCSuccess {
						t.Fatalf("answer %+v", wc)
					}
					got++
				}
			}
			writes := s.dev.Stats().Writes - before
			t.Logf("%d answers in %d writes", n, writes)
			if held && writes > 3 {
				t.Errorf("%d held answers to one BATCH of requests took %d writes, want at most 3", n, writes)
			}
		})
	}
}
