package soft

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// rawPeer connects a and b over TCP and returns a's stream: writing on it speaks for a on
// the wire, as a hostile peer would (a's QP is left idle meanwhile).
func rawPeer(t *testing.T, a, b *host) net.Conn {
	t.Helper()
	var mu sync.Mutex
	var dialed net.Conn
	connectVia(t, b, a, func(c net.Conn) net.Conn { // a accepts: the wrapped stream is a's
		mu.Lock()
		dialed = c
		mu.Unlock()
		return c
	})
	mu.Lock()
	defer mu.Unlock()
	return dialed
}

// waitFault polls q until it is in ERR and returns its fault.
func waitFault(t *testing.T, h *host) error {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h.qp.State() != verbs.QPStateError {
		if time.Now().After(deadline) {
			t.Fatalf("QP still %v after 5s", h.qp.State())
		}
		time.Sleep(time.Millisecond)
	}
	return h.qp.(verbs.FaultReporter).Fault()
}

// TestFaultFrameStall: a peer that sends a frame's first bytes and then nothing loses the
// link after the stall limit, and the QP says why; an idle stream is never bounded.
func TestFaultFrameStall(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes func() []byte
	}{
		{"header cut off", func() []byte { return appendHeader(nil, &header{op: opSend, len: 100})[:7] }},
		{"small payload cut off", func() []byte { return enc(opSend, 100)[:headerLen+10] }},
		{"large payload cut off", func() []byte {
			return append(appendHeader(nil, &header{op: opSend, len: 4096}), make([]byte, smallMax+500)...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newHost(t, mustOpen(t), 1<<16), newHost(t, mustOpen(t), 1<<16)
			defer a.close(t)
			defer b.close(t)
			peer := rawPeer(t, a, b)
			b.qp.(*QP).stallLimit.Store(int64(50 * time.Millisecond))
			must(t, b.qp.PostRecv([]verbs.RecvWR{{WRID: 2, SGL: []verbs.SGE{verbs.SGEFor(b.mr, 0, 8192)}}}))
			time.Sleep(150 * time.Millisecond) // idle, longer than the limit: nothing happens
			if s := b.qp.State(); s != verbs.QPStateRTS {
				t.Fatalf("an idle stream moved the QP to %v", s)
			}
			if _, err := peer.Write(tc.bytes()); err != nil {
				t.Fatal(err)
			}
			err := waitFault(t, b)
			if !errors.Is(err, verbs.ErrPeerProtocol) || !strings.Contains(err.Error(), "middle of a frame") {
				t.Fatalf("fault: %v", err)
			}
		})
	}
}

// TestFaultMalformedFrame: a frame the reader cannot parse ends the link with a fault (and
// is not a peer that left).
func TestFaultMalformedFrame(t *testing.T) {
	a, b := newHost(t, mustOpen(t), 1<<16), newHost(t, mustOpen(t), 1<<16)
	defer a.close(t)
	defer b.close(t)
	peer := rawPeer(t, a, b)
	if _, err := peer.Write(make([]byte, headerLen)); err != nil { // opcode 0
		t.Fatal(err)
	}
	if err := waitFault(t, b); !errors.Is(err, verbs.ErrPeerProtocol) || !strings.Contains(err.Error(), "malformed frame") {
		t.Fatalf("fault: %v", err)
	}
	if b.qp.(verbs.PeerLeftReporter).PeerLeft() {
		t.Fatal("PeerLeft is true for a peer that broke the protocol")
	}
}

// TestFaultRemoteAccess: a READ with a key the target does not grant moves the target's QP
// to ERR with a fault that names the key; the requester sees REM_ACCESS_ERR.
func TestFaultRemoteAccess(t *testing.T) {
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			a, b := newHost(t, open("a"), 1<<16), newHost(t, open("b"), 1<<16)
			defer a.close(t)
			defer b.close(t)
			connect(t, a, b)
			if err := b.qp.(verbs.FaultReporter).Fault(); err != nil {
				t.Fatalf("fault before anything happened: %v", err)
			}
			const rkey = 0x123456
			must(t, a.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{verbs.SGEFor(a.mr, 0, 64)}, RemoteAddr: b.mr.Addr(), RKey: rkey}}))
			if wc := a.poll(t); wc.Status != verbs.WCRemAccessErr {
				t.Fatalf("requester: %v", wc)
			}
			err := waitFault(t, b)
			if !errors.Is(err, verbs.ErrRemoteAccess) || !strings.Contains(err.Error(), "rkey 0x123456") {
				t.Fatalf("fault: %v", err)
			}
		})
	}
}

// TestSendQueueGrows: the send queue ring starts small and grows as work requests are
// outstanding, up to max_send_wr and no further; every request completes, in order.
func TestSendQueueGrows(t *testing.T) {
	a, b := newHost(t, mustOpen(t), 1<<16), newHost(t, mustOpen(t), 1<<16)
	defer a.close(t)
	defer b.close(t)
	connect(t, a, b)
	q := a.qp.(*QP)
	ringLen := func() int { q.mu.Lock(); defer q.mu.Unlock(); return len(q.sq) }
	if n := ringLen(); n != sqInitial {
		t.Fatalf("a new QP's ring holds %d, want %d", n, sqInitial)
	}
	wrs := make([]verbs.SendWR, 257) // max_send_wr is 256: the last one is refused
	for i := range wrs {
		wrs[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEFor(a.mr, 64*(i%64), 64)}, RemoteAddr: b.mr.Addr() + uint64(64*(i%64)), RKey: b.mr.RKey()}
	}
	err := a.qp.PostSend(wrs)
	var pe *verbs.PostError
	// The engine may finish some while the batch is posted, making room: at most the last
	// is refused, and only as queue full.
	if err != nil && (!errors.As(err, &pe) || !errors.Is(err, verbs.ErrQueueFull) || pe.Index < 256) {
		t.Fatalf("posting 257: %v", err)
	}
	posted := len(wrs)
	if pe != nil {
		posted = pe.Index
	}
	for i := 0; i < posted; i++ {
		if wc := a.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if n := ringLen(); n <= sqInitial || n > 256 {
		t.Fatalf("the ring holds %d after 256 outstanding, want more than %d and at most 256", n, sqInitial)
	}
}

// TestPeerLeft: a peer whose QP goes away while a SEND is outstanding (here one the peer
// never posted a receive for) leaves this QP in ERR with PeerLeft true and no fault, on
// either fabric; the SEND completes with RETRY_EXC_ERR if it had left, WR_FLUSH_ERR if it
// waited to be sent again (the peer's receiver-not-ready). (A peer that breaks the
// protocol leaves a fault and PeerLeft false: TestFaultMalformedFrame.)
func TestPeerLeft(t *testing.T) {
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			a, b := newHost(t, open("a"), 1<<16), newHost(t, open("b"), 1<<16)
			defer a.close(t)
			connect(t, a, b)
			must(t, a.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{verbs.SGEFor(a.mr, 0, 64)}}}))
			b.close(t)
			if wc := a.poll(t); wc.Status != verbs.WCRetryExcErr && wc.Status != verbs.WCWRFlushErr || wc.WRID != 1 {
				t.Fatalf("the SEND outstanding: %+v, want RETRY_EXC_ERR or WR_FLUSH_ERR", wc)
			}
			if !a.qp.(verbs.PeerLeftReporter).PeerLeft() {
				t.Fatal("PeerLeft is false after the peer's QP went away")
			}
			if err := a.qp.(verbs.FaultReporter).Fault(); err != nil {
				t.Fatalf("fault: %v", err)
			}
		})
	}
}

// handPeer connects b's QP to a peer made by hand: the endpoint exchange written and read
// on a loopback TCP connection, which then carries b's frames and nothing else's. It
// returns that connection and the first PSN b expects of it.
func handPeer(t *testing.T, b *host) (net.Conn, uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	peer, accepted := dialQP(ctx, t, b.qp, nil)
	t.Cleanup(func() { peer.Close() })
	const psn = 100
	in := make([]byte, 32)
	if err := cm.Exchange(ctx, peer, "endpoint", cm.AppendEndpoint(nil, verbs.Endpoint{QPN: 0x4242, PSN: psn}), in); err != nil {
		t.Fatal(err)
	}
	if err := accepted(); err != nil {
		t.Fatal(err)
	}
	return peer, psn
}

// TestAckRequestAnswered: a SEND that asks for its ACK (flagAckReq) is acknowledged at
// once, alone, by an ACK of its own PSN, where one without the flag waits for a frame of
// the responder's or its delayed-ACK timer; the peer gets one ACK a message, and the
// timer never fires for them (Stats.DelayedAcks).
func TestAckRequestAnswered(t *testing.T) {
	b := newHost(t, mustOpen(t), 1<<16)
	defer b.close(t)
	peer, psn := handPeer(t, b)
	const sends = 4 // fewer than ackEvery: only the flag makes an ACK due before the timer
	for i := range sends {
		must(t, b.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(b.mr, 64*i, 64)}}}))
	}
	fr := frameReader{r: peer}
	for i := range sends {
		h := header{op: opSend, flags: flagAckReq, psn: (psn + uint32(i)) & psnMask, len: 16}
		if _, err := peer.Write(append(appendHeader(nil, &h), make([]byte, 16)...)); err != nil {
			t.Fatal(err)
		}
		// Whether the ACK came at once is DelayedAcks' to say below, not a clock's: a
		// loaded machine may take a millisecond to send it either way.
		must(t, peer.SetReadDeadline(time.Now().Add(5*time.Second)))
		var got header
		if _, err := fr.next(&got); err != nil {
			t.Fatalf("SEND %d with the ACK request: no frame back: %v", i, err)
		}
		if got.op != opAck || got.psn != h.psn {
			t.Fatalf("SEND %d (psn %d) with the ACK request: got %v psn %d, want its ACK", i, h.psn, got.op, got.psn)
		}
		if wc := b.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	must(t, peer.SetReadDeadline(time.Now().Add(3*ackDelay)))
	var extra header
	if _, err := fr.next(&extra); err == nil {
		t.Fatalf("a frame more than the %d ACKs: %v psn %d", sends, extra.op, extra.psn)
	}
	if n := b.dev.Stats().DelayedAcks; n != 0 {
		t.Fatalf("%d of the %d ACKs waited for the delayed-ACK timer, want none: the request was not answered at once", n, sends)
	}
}
