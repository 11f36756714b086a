package soft

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestBoundedWritesItself: PostSendBounded writes a 1 MiB WRITE and the SEND that announces
// it on the poster's goroutine, with no wake-up of the NIC engine, and the peer finds the
// payload in place before the announcement, as with the engine's write.
func TestBoundedWritesItself(t *testing.T) {
	c, s := bigPair(t)
	if tl, ok := c.qp.(*QP).link.(*tcpLink); !ok || !tl.boundable() {
		t.Skip("no raw socket writes on this OS: PostSendBounded is PostSend here")
	}
	q := c.qp.(*QP)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := c.dev.Stats()
	writeAndAnnounce(t, c, s, func(wrs []verbs.SendWR) error { return q.PostSendBounded(ctx, wrs) }, big, []int{68}, 5)
	after := c.dev.Stats()
	if n := after.BoundedPosts - before.BoundedPosts; n != 1 {
		t.Errorf("%d rounds written by the poster, want 1", n)
	}
	if n := after.EngineWakes - before.EngineWakes; n != 0 {
		t.Errorf("%d engine wake-ups, want none", n)
	}
	if n := after.BoundedCut - before.BoundedCut; n != 0 {
		t.Errorf("%d bounded writes cut short, want none", n)
	}
}

// TestBoundedWriteCut: a caller writing to a peer that stopped reading returns once its
// context ends (its deadline, or a cancel), and the NIC engine writes the rest of the frame
// from registered memory once the peer reads again: the WRITE's payload and the SEND behind
// it arrive whole and in order.
func TestBoundedWriteCut(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, cancel
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const flood = 32 << 20 // more than loopback's socket buffers hold
			c, s, sc := stalledPair(t, flood)
			q := c.qp.(*QP)
			src := c.mr.Bytes()[:flood]
			for i := range src {
				src[i] = byte(i*7 + i>>16)
			}
			copy(c.mr.Bytes()[flood:], "announce")
			must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 9, SGL: []verbs.SGE{verbs.SGEFor(s.mr, flood, 8)}}}))
			wrs := []verbs.SendWR{
				{WRID: 1, Opcode: verbs.WRRDMAWrite, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, flood)}, RemoteAddr: s.mr.Addr(), RKey: s.mr.RKey()},
				{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(c.mr, flood, 8)}},
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			before := c.dev.Stats()
			must(t, q.PostSendBounded(ctx, wrs))
			if took := time.Since(start); took > 2*time.Second {
				t.Fatalf("PostSendBounded returned %v after its context ended at 100ms", took)
			}
			select {
			case <-sc.stalled:
			default:
				t.Fatal("the peer's reader never stalled: the test wrote less than its socket buffers hold")
			}
			after := c.dev.Stats()
			if after.BoundedPosts-before.BoundedPosts != 1 || after.BoundedCut-before.BoundedCut != 1 {
				t.Fatalf("%d bounded rounds, %d cut short; want 1 and 1", after.BoundedPosts-before.BoundedPosts, after.BoundedCut-before.BoundedCut)
			}
			// A SEND posted after the cut leaves after the rest, not ahead of it.
			must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 10, SGL: []verbs.SGE{verbs.SGEFor(s.mr, flood+8, 8)}}}))
			copy(c.mr.Bytes()[flood+8:], "and then")
			must(t, q.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.WRSend, SGL: []verbs.SGE{verbs.SGEFor(c.mr, flood+8, 8)}}}))
			close(sc.release)
			for _, want := range []uint64{9, 10} {
				if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != want || wc.ByteLen != 8 {
					t.Fatalf("receive %+v, want WRID %d", wc, want)
				}
			}
			if string(s.mr.Bytes()[flood+8:flood+16]) != "and then" {
				t.Fatal("the later SEND's payload differs")
			}
			if !bytes.Equal(s.mr.Bytes()[:flood], src) {
				t.Fatal("the WRITE's payload arrived torn: the engine did not write the rest as the poster left it")
			}
			if string(s.mr.Bytes()[flood:flood+8]) != "announce" {
				t.Fatal("the announcement's payload differs")
			}
			if wc := c.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != 2 {
				t.Fatalf("send completion %+v", wc)
			}
		})
	}
}

// TestDestroyWhileBoundedWriterWaits: a caller whose context never ends, blocked writing to
// a peer that stopped reading, does not hold up Destroy (the deadline shutdownLocked sets
// before it takes the transmit lock is not lifted by the bounded write), and returns.
func TestDestroyWhileBoundedWriterWaits(t *testing.T) {
	const flood = 32 << 20
	c, _, sc := stalledPair(t, flood)
	var once sync.Once
	release := func() { once.Do(func() { close(sc.release) }) }
	defer release()
	q := c.qp.(*QP)
	posted := make(chan error, 1)
	go func() {
		posted <- q.PostSendBounded(context.Background(), []verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMAWrite,
			Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, flood)}, RemoteAddr: 0, RKey: 1}})
	}()
	select {
	case <-sc.stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's reader never stopped")
	}
	destroyWhileBlocked(t, c, release, posted, "PostSendBounded")
}

// stalledPair returns two connected hosts of n bytes (and 64 more) each, whose server side
// stops reading its stream after a few KiB until sc.release is closed; closed at cleanup.
func stalledPair(t *testing.T, n int) (c, s *host, sc *stallConn) {
	t.Helper()
	c, s = newHost(t, mustOpen(t), n+64), newHost(t, mustOpen(t), n+64)
	t.Cleanup(func() { c.close(t) })
	t.Cleanup(func() { s.close(t) })
	sc = &stallConn{stalled: make(chan struct{}), release: make(chan struct{})}
	connectVia(t, c, s, func(conn net.Conn) net.Conn { sc.Conn = conn; return sc })
	if tl, ok := c.qp.(*QP).link.(*tcpLink); !ok || !tl.boundable() {
		close(sc.release)
		t.Skip("no raw socket writes on this OS: PostSendBounded is PostSend here")
	}
	sc.arm()
	return c, s, sc
}
