package soft

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestLoneAck checks that an ACK no frame carries still leaves: SENDs to a peer that never
// sends anything complete within a bound, whether the delayed-ACK timer is idle, armed
// for traffic, or watching an earlier ACK when they arrive.
func TestLoneAck(t *testing.T) {
	const bound = 100 * time.Millisecond
	pauses := []time.Duration{0, 0, ackDelay / 4, ackDelay / 2, 2 * ackDelay, 0, 10 * ackDelay, ackDelay}
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			c, s := newHost(t, open("c"), 1<<16), newHost(t, open("s"), 1<<16)
			defer c.close(t)
			defer s.close(t)
			connect(t, c, s)
			for i := range pauses {
				must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(s.mr, 64*i, 64)}}}))
			}
			for i, p := range pauses {
				time.Sleep(p)
				start := time.Now()
				must(t, c.qp.PostSend([]verbs.SendWR{{WRID: uint64(100 + i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 16)}}}))
				wc, ok := pollWithin(t, c.cq, bound)
				if !ok {
					t.Fatalf("SEND %d (after a pause of %v): no completion within %v: the peer never acknowledged it", i, p, bound)
				}
				if wc.Status != verbs.WCSuccess || wc.WRID != uint64(100+i) {
					t.Fatalf("SEND %d: %+v", i, wc)
				}
				t.Logf("SEND %d after %v: completed in %v", i, p, time.Since(start).Round(time.Microsecond))
				if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) {
					t.Fatalf("receive %d: %+v", i, wc)
				}
			}
		})
	}
}

// pollWithin polls cq for one completion for at most d.
func pollWithin(t testing.TB, cq verbs.CQ, d time.Duration) (verbs.WorkCompletion, bool) {
	t.Helper()
	var wcs [1]verbs.WorkCompletion
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Microsecond) {
		n, err := cq.Poll(wcs[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wcs[0], true
		}
	}
	return verbs.WorkCompletion{}, false
}

// maxDelayedAcks is the most ACKs of a stream of 64 SENDs that may wait out the timer in
// the ACK request's tests: the stream's last, and a few its poster's stalls may leave.
const maxDelayedAcks = 4

// TestAckRequest: a sender whose send queue is shorter than ackEvery asks for its ACK
// once half the queue is unacknowledged (flagAckReq), so that a stream of SENDs nobody
// answers keeps moving: the receiver lets hardly any ACK wait for the delayed-ACK timer
// (Stats.DelayedAcks), where without the request every queueful's would (a queue of 4
// took about 1 ms per four SENDs).
func TestAckRequest(t *testing.T) {
	const sends = 64
	for _, depth := range []int{1, 2, 4, 7, 16} {
		for name, open := range fabrics(t) {
			t.Run(fmt.Sprintf("%s/sq%d", name, depth), func(t *testing.T) {
				c, s := newHost(t, open("c"), 1<<16), newHost(t, open("s"), 1<<16)
				defer c.close(t)
				defer s.close(t)
				c.shortSQ(t, depth)
				connect(t, c, s)
				for i := range sends {
					must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(s.mr, 64*i, 64)}}}))
				}
				streamSends(t, c, sends, depth)
				for i := range sends {
					if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) {
						t.Fatalf("receive %d: %+v", i, wc)
					}
				}
				// Without the request a queue of 7 or less lets 9 to 64 wait; with it, the
				// last, and any a stall of this goroutine past the timer (a loaded machine).
				if n := s.dev.Stats().DelayedAcks; n > maxDelayedAcks {
					t.Fatalf("%d SENDs through a send queue of %d: the receiver let %d ACKs wait for its timer, want at most %d", sends, depth, n, maxDelayedAcks)
				}
			})
		}
	}
}

// shortSQ replaces h's QP, not yet connected, with one whose send queue holds depth work
// requests.
func (h *host) shortSQ(t testing.TB, depth int) {
	t.Helper()
	must(t, h.qp.Destroy())
	var err error
	h.qp, err = h.pd.CreateQP(verbs.QPInitAttr{SendCQ: h.cq, RecvCQ: h.cq, Cap: verbs.QPCap{
		MaxSendWR: depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(t, err)
}

// BenchmarkSendStream measures 16-byte SENDs nobody answers, each signaled, through a send
// queue of 4 or 64 kept full: what a SEND costs while its ACKs keep coming, and how many
// waited out the delayed-ACK timer (delayed-acks/op). A goroutine reposts the receives.
func BenchmarkSendStream(b *testing.B) {
	for _, fabric := range []string{"inproc", "tcp"} {
		for _, depth := range []int{4, 64} {
			b.Run(fmt.Sprintf("%s/sq%d", fabric, depth), func(b *testing.B) {
				open := fabrics(b)[fabric]
				c, s := newHost(b, open("c"), 1<<16), newHost(b, open("s"), 1<<16)
				defer c.close(b)
				defer s.close(b)
				c.shortSQ(b, depth)
				connect(b, c, s)
				defer s.repostRecvs(b, 256)()
				b.ResetTimer()
				streamSends(b, c, b.N, depth)
				b.StopTimer()
				b.ReportMetric(float64(s.dev.Stats().DelayedAcks)/float64(b.N), "delayed-acks/op")
			})
		}
	}
}

// repostRecvs posts n receives on h's QP and reposts each one that completes, on a
// goroutine of its own, until the returned func is called.
func (h *host) repostRecvs(t testing.TB, n int) (stop func()) {
	recv := []verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(h.mr, 0, 64)}}}
	for range n {
		must(t, h.qp.PostRecv(recv))
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		wcs := make([]verbs.WorkCompletion, 32)
		for {
			k, _ := h.cq.Poll(wcs)
			for range k {
				if h.qp.PostRecv(recv) != nil {
					return
				}
			}
			if k > 0 {
				continue
			}
			select {
			case <-quit:
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	return func() { close(quit); <-done }
}

// streamSends posts n SENDs from c, keeping its send queue of depth full, and checks that
// each completes, in order.
func streamSends(t testing.TB, c *host, n, depth int) {
	t.Helper()
	var wcs [16]verbs.WorkCompletion
	done := 0
	deadline := time.Now().Add(10 * time.Second)
	for posted := 0; done < n; {
		for posted < n && posted-done < depth {
			must(t, c.qp.PostSend([]verbs.SendWR{{WRID: uint64(posted), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 16)}}}))
			posted++
		}
		k, err := c.cq.Poll(wcs[:])
		must(t, err)
		for _, wc := range wcs[:k] {
			if wc.Status != verbs.WCSuccess || wc.WRID != uint64(done) {
				t.Fatalf("SEND %d: %+v", done, wc)
			}
			done++
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d SENDs completed in 10s", done, n)
		}
		if k == 0 {
			runtime.Gosched() // a sleep would take tens of microseconds at least
		}
	}
}
