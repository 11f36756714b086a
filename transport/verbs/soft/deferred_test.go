package soft

import (
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestDeferredPostsLeaveTogether: messages posted with PostSendDeferred stay queued (no
// write, nothing delivered) until Flush, which sends them all in one write, in post order;
// a plain post after deferred ones takes them with it.
func TestDeferredPostsLeaveTogether(t *testing.T) {
	c, s, sq, _ := heldPair(t)
	const n = 6
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		fillMessage(s.mr.Bytes()[i*heldSlot:i*heldSlot+64], i)
		must(t, c.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(c.mr, i*heldSlot, heldSlot)}}}))
		wrs[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(s.mr, i*heldSlot, 64)}}
	}
	receive := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			wc, ok := pollFor(t, c, 5*time.Second)
			if !ok {
				t.Fatalf("receive %d: no completion within 5s", i)
			}
			if err := checkMessage(wc, c.mr.Bytes()[i*heldSlot:], i, 64); err != nil {
				t.Fatal(err)
			}
		}
	}

	before := s.dev.Stats().Writes
	for i := range 3 {
		if deferred, err := sq.PostSendDeferred(wrs[i : i+1]); err != nil || !deferred {
			t.Fatalf("PostSendDeferred on a TCP socket: deferred %v, err %v; want it deferred", deferred, err)
		}
	}
	if w := s.dev.Stats().Writes - before; w != 0 {
		t.Fatalf("%d writes after three deferred posts, want 0: a deferred post waits for the next transmission", w)
	}
	if wc, ok := pollFor(t, c, 20*time.Millisecond); ok {
		t.Fatalf("the peer received %+v before Flush", wc)
	}
	sq.Flush()
	receive(0, 3)
	if w := s.dev.Stats().Writes - before; w != 1 {
		t.Errorf("Flush took %d writes for three small deferred messages, want 1", w)
	}

	// Deferred posts, then a plain one: the plain post transmits them all, in order.
	before = s.dev.Stats().Writes
	if _, err := sq.PostSendDeferred(wrs[3:5]); err != nil {
		t.Fatal(err)
	}
	must(t, sq.PostSend(wrs[5:]))
	receive(3, n)
	if w := s.dev.Stats().Writes - before; w != 1 {
		t.Errorf("a plain post after two deferred ones took %d writes, want 1", w)
	}
	for range n {
		if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend {
			t.Fatalf("send completion %+v", wc)
		}
	}
	sq.Flush() // nothing queued: nothing written
	if w := s.dev.Stats().Writes - before; w != 1 {
		t.Errorf("Flush with nothing queued wrote: %d writes, want 1", w)
	}
}
