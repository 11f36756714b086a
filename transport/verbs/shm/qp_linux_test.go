package shm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
	"github.com/mwrpc/mwrpc/transport/verbs/internal/qptest"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// qpPair is two soft QPs connected by cm over a fresh shm connection, each on a device of
// its own; a and b are the connection's ends (a the dialer's).
type qpPair struct {
	qa, qb verbs.QP
	a, b   *Conn
	devs   [2]*soft.Device
	pds    [2]verbs.PD
	cqs    [2]verbs.CQ
}

func newQPPair(t *testing.T) *qpPair { return newQPPairWith(t, Config{}) }

// newQPPairWith is newQPPair with cfg on both ends.
func newQPPairWith(t *testing.T, cfg Config) *qpPair {
	return newQPPairCap(t, cfg, verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
}

// newQPPairCap is newQPPairWith with both QPs' capacities c.
func newQPPairCap(t *testing.T, cfg Config, c verbs.QPCap) *qpPair {
	t.Helper()
	p := &qpPair{}
	p.a, p.b = connPair(t, cfg, cfg)
	var qps [2]verbs.QP
	for i := range qps {
		dev, _ := soft.OpenTCP("qp")
		qp, cq := qptest.NewWithCap(t, dev, c)
		qps[i], p.devs[i], p.pds[i], p.cqs[i] = qp, dev, qp.PD(), cq
	}
	p.qa, p.qb = qps[0], qps[1]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := cm.Connect(ctx, p.b, p.qb, cm.DefaultParams()); errc <- err }()
	if _, err := cm.Connect(ctx, p.a, p.qa, cm.DefaultParams()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return p
}

// waitErr waits until qp is in ERR and returns its fault.
func waitErr(t *testing.T, qp verbs.QP) error {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); qp.State() != verbs.QPStateError; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("QP %d still %v 5s after its peer broke the ring", qp.Num(), qp.State())
		}
	}
	return qp.(verbs.FaultReporter).Fault()
}

// TestQPFaultOnBrokenRing: a peer that publishes a ring position outside the ring, or
// writes garbage frames into it, moves the QP reading it to ERR with a fault wrapping
// verbs.ErrPeerProtocol (the QP's user counts it as an attack, not as a peer that left); a
// QP pair on another connection goes on.
func TestQPFaultOnBrokenRing(t *testing.T) {
	for _, tc := range []struct {
		name string
		poke func(attacker *Conn)
	}{
		{"tail outside the ring", func(x *Conn) {
			x.wmu.Lock()
			x.tx.tail.Store(x.tx.pos + x.tx.size + 4096)
			ringBell(x.peerRxBell)
			x.wmu.Unlock()
		}},
		{"garbage frame", func(x *Conn) {
			garbage := make([]byte, 64)
			for i := range garbage {
				garbage[i] = 0xee
			}
			if _, err := x.Write(garbage); err != nil {
				panic(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			victim, other := newQPPair(t), newQPPair(t)
			tc.poke(victim.a) // the dialer's end speaks for qa: qb reads the garbage
			fault := waitErr(t, victim.qb)
			if !errors.Is(fault, verbs.ErrPeerProtocol) {
				t.Fatalf("fault: %v, want ErrPeerProtocol", fault)
			}
			t.Logf("fault: %v", fault)
			if s := other.qa.State(); s != verbs.QPStateRTS {
				t.Fatalf("a QP on another connection is %v", s)
			}
			if s := other.qb.State(); s != verbs.QPStateRTS {
				t.Fatalf("a QP on another connection is %v", s)
			}
		})
	}
}

// TestAckRequestOverSHM: over the shm fabric as over sockets, a sender whose send queue
// (4 here) is shorter than the responder's ACK coalescing asks for its ACK once half the
// queue is unacknowledged, so that SENDs nobody answers keep completing: the receiver lets
// hardly any ACK wait for its delayed-ACK timer (soft.Stats.DelayedAcks).
func TestAckRequestOverSHM(t *testing.T) {
	const sends = 64
	p := newQPPairCap(t, Config{}, verbs.QPCap{MaxSendWR: 4, MaxRecvWR: sends, MaxSendSGE: 1, MaxRecvSGE: 1})
	s := newSendSetup(t, p, 64*sends)
	for i := range sends {
		sge := verbs.SGE{Addr: s.dstMR.Addr() + uint64(64*i), Length: 64, LKey: s.dstMR.LKey()}
		if err := p.qb.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{sge}}}); err != nil {
			t.Fatal(err)
		}
	}
	wr := verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: sges(s.srcMR, 16, 1)}
	for posted, done := 0, 0; done < sends; {
		for ; posted < sends && posted-done < 4; posted++ {
			wr.WRID = uint64(posted)
			if err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
		}
		if wc := waitWC(t, p.cqs[0], 0); wc.WRID != uint64(done) {
			t.Fatalf("SEND %d completed as %+v", done, wc)
		}
		// Acknowledged, so received: its completion was queued before the ACK left.
		if wc := waitWC(t, p.cqs[1], 16); wc.WRID != uint64(done) || wc.ByteLen != 16 {
			t.Fatalf("receive %d: %+v", done, wc)
		}
		done++
	}
	// Without the request 16 wait; with it the last, and any a stall of this goroutine past
	// the timer leaves (a loaded machine).
	if n := p.devs[1].Stats().DelayedAcks; n > 4 {
		t.Fatalf("%d SENDs through a send queue of 4: the receiver let %d ACKs wait for its timer, want at most 4", sends, n)
	}
}
