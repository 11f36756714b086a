package soft

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/mwrpc/mwrpc/internal/clock"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestStepSaysWhatIsLeft: a step that transmits a frame reports whether the QP has more to
// transmit, so that the transmitter stops after the last frame without taking q.mu again
// to find nothing; both frames arrive.
func TestStepSaysWhatIsLeft(t *testing.T) {
	c, s := bigPair(t)
	q := c.qp.(*QP)
	for i := range 2 {
		must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(s.mr, i*64, 64)}}}))
	}
	copy(c.mr.Bytes(), bytes.Repeat([]byte{7}, 128))
	wrs := []verbs.SendWR{
		{WRID: 10, Opcode: verbs.WRSend, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 64)}},
		{WRID: 11, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 64, 64)}},
	}
	q.txMu.Lock() // what the poster would do, one step at a time
	q.mu.Lock()
	if _, err := q.postLocked(wrs); err != nil {
		q.mu.Unlock()
		q.txMu.Unlock()
		t.Fatal(err)
	}
	l := q.link
	q.mu.Unlock()
	first, second := q.step(l, 0), q.step(l, 0)
	q.flushTx(l)
	q.letGoTx()
	if first != stepMore || second != stepIdle {
		t.Errorf("two SENDs queued: the steps said %v then %v, want %v (one left) then %v (none)", first, second, stepMore, stepIdle)
	}
	for range 2 {
		if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.ByteLen != 64 {
			t.Fatalf("receive: %+v", wc)
		}
	}
	if wc := c.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != 11 {
		t.Fatalf("send: %+v", wc)
	}
}

// TestSmallPayloadInMemory: a SEND whose payload is in memory and small enough is copied
// into its receive with q.mu held (onRequest) and completes with its bytes; one whose
// frame holds fewer bytes than its header says completes its receive flushed and fails the
// delivery, losing no receive to the next frame.
func TestSmallPayloadInMemory(t *testing.T) {
	_, s := bigPair(t)
	q := s.qp.(*QP)
	for i := range 2 {
		must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i + 1), SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, 4096)}}}))
	}
	payload := bytes.Repeat([]byte("mwrpc"), 20)
	for _, tc := range []struct {
		name    string
		src     []byte
		wantErr error
		status  verbs.WCStatus
	}{
		{"whole", payload, nil, verbs.WCSuccess},
		{"short", payload[:10], io.ErrUnexpectedEOF, verbs.WCWRFlushErr},
	} {
		q.mu.Lock()
		h := header{op: opSend, psn: q.ePSN, len: uint32(len(payload))}
		q.mu.Unlock()
		err := q.deliver(&h, &bufSource{b: tc.src}, clock.Nanos())
		if !errors.Is(err, tc.wantErr) {
			t.Fatalf("%s: deliver: %v, want %v", tc.name, err, tc.wantErr)
		}
		wc := s.poll(t)
		if wc.Status != tc.status {
			t.Fatalf("%s: receive completed %v, want %v", tc.name, wc.Status, tc.status)
		}
		if tc.status == verbs.WCSuccess && (wc.ByteLen != uint32(len(payload)) || !bytes.Equal(s.mr.Bytes()[:len(payload)], payload)) {
			t.Fatalf("%s: %d bytes received, intact %v", tc.name, wc.ByteLen, bytes.Equal(s.mr.Bytes()[:len(payload)], payload))
		}
	}
}
