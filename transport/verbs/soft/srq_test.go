package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// srqQP creates one more QP on h's SRQ and CQ.
func (h *host) srqQP(t testing.TB) verbs.QP {
	t.Helper()
	qp, err := h.pd.CreateQP(verbs.QPInitAttr{SendCQ: h.cq, RecvCQ: h.cq, SRQ: h.srq, Cap: verbs.QPCap{
		MaxSendWR: 256, MaxSendSGE: 4, MaxInlineData: 256}})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

// TestSRQConcurrentReaders has eight clients send to eight QPs of one server that share
// an SRQ smaller than what is in flight, so that the QPs' readers take receives from it
// at once and some SENDs meet an empty SRQ (RNR, retried). Every message must arrive
// exactly once, intact, in its QP's order, and every receive be used once per post.
func TestSRQConcurrentReaders(t *testing.T) {
	const clients, msgs, depth = 8, 200, 32
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			srv := newSRQHost(t, open("srv"), depth*64, depth)
			qps := []verbs.QP{srv.qp}
			var cs []*host
			for i := 0; i < clients; i++ {
				c := newHost(t, open(fmt.Sprintf("c%d", i)), msgs*64)
				s := *srv
				if i > 0 {
					s.qp = srv.srqQP(t)
					qps = append(qps, s.qp)
				}
				connect(t, c, &s)
				cs = append(cs, c)
			}
			defer func() {
				for _, c := range cs {
					c.close(t)
				}
				for _, qp := range qps[1:] {
					must(t, qp.Destroy())
				}
				srv.close(t)
			}()
			recv := func(i int) verbs.RecvWR {
				return verbs.RecvWR{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(srv.mr, i*64, 64)}}
			}
			for i := 0; i < depth; i++ {
				must(t, srv.srq.PostRecv([]verbs.RecvWR{recv(i)}))
			}
			var wg sync.WaitGroup
			errc := make(chan error, clients)
			for i, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					wrs := make([]verbs.SendWR, msgs)
					for m := range wrs {
						b := c.mr.Bytes()[m*64 : m*64+64]
						binary.LittleEndian.PutUint32(b, uint32(i))
						binary.LittleEndian.PutUint32(b[4:], uint32(m))
						wrs[m] = verbs.SendWR{WRID: uint64(m), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(c.mr, m*64, 64)}}
					}
					if err := c.qp.PostSend(wrs); err != nil {
						errc <- err
						return
					}
					wcs := make([]verbs.WorkCompletion, 64)
					deadline := time.Now().Add(20 * time.Second)
					for got := 0; got < msgs; {
						n, err := c.cq.Poll(wcs)
						if err != nil {
							errc <- err
							return
						}
						for _, wc := range wcs[:n] {
							if wc.Status != verbs.WCSuccess {
								errc <- fmt.Errorf("client %d: %v", i, wc)
								return
							}
						}
						got += n
						if n == 0 {
							if time.Now().After(deadline) {
								errc <- fmt.Errorf("client %d: %d of %d SENDs completed", i, got, msgs)
								return
							}
							time.Sleep(50 * time.Microsecond)
						}
					}
				}()
			}
			next := make(map[uint32]uint32) // QP number -> next message
			client := make(map[uint32]uint32)
			wcs := make([]verbs.WorkCompletion, 64)
			deadline := time.Now().Add(20 * time.Second)
			for got := 0; got < clients*msgs; {
				n, err := srv.cq.Poll(wcs)
				if err != nil {
					t.Fatal(err)
				}
				for _, wc := range wcs[:n] {
					if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.ByteLen != 64 {
						t.Fatalf("server: %v", wc)
					}
					b := srv.mr.Bytes()[wc.WRID*64:]
					ci, m := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
					if c, ok := client[wc.QPNum]; ok && c != ci {
						t.Fatalf("server: QP %d received from client %d and from client %d", wc.QPNum, c, ci)
					}
					client[wc.QPNum] = ci
					if m != next[wc.QPNum] {
						t.Fatalf("server: QP %d (client %d) received message %d, want %d", wc.QPNum, ci, m, next[wc.QPNum])
					}
					next[wc.QPNum]++
					must(t, srv.srq.PostRecv([]verbs.RecvWR{recv(int(wc.WRID))}))
				}
				got += n
				if n == 0 {
					if time.Now().After(deadline) {
						t.Fatalf("server: %d of %d receives within 20 s", got, clients*msgs)
					}
					time.Sleep(50 * time.Microsecond)
				}
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
			if len(client) != clients {
				t.Errorf("messages came through %d QPs, want %d", len(client), clients)
			}
			t.Logf("%d messages through %d QPs on one SRQ of %d receives; RNR NAKs %d", clients*msgs, clients, depth, srv.dev.Stats().RNRNaks)
		})
	}
}

// TestSRQRecvAllocs checks that the SRQ's receive path allocates nothing: a 64-byte SEND
// into a receive taken from the SRQ, reposted, on the in-process fabric.
func TestSRQRecvAllocs(t *testing.T) {
	f := NewFabric()
	open := func(n string) *Device { d, _ := f.Open(n); return d }
	c, s := newHost(t, open("c"), 1<<16), newSRQHost(t, open("s"), 1<<16, 16)
	defer c.close(t)
	defer s.close(t)
	connect(t, c, s)
	recv := []verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, 64)}}}
	send := []verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 64)}}}
	round := func() {
		must(t, s.srq.PostRecv(recv))
		must(t, c.qp.PostSend(send))
		if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.QPNum != s.qp.Num() {
			t.Fatalf("receive: %v", wc)
		}
		if wc := c.poll(t); wc.Status != verbs.WCSuccess {
			t.Fatalf("send: %v", wc)
		}
	}
	round() // warm up the QPs' scratch
	if n := testing.AllocsPerRun(200, round); n > 0 {
		t.Errorf("%.1f allocations per SEND received through an SRQ, want 0", n)
	}
}

// stallConn lets a test stop a stream reader in the middle of a payload: once armed, it
// hands out at most 1 KiB per read, and after 4 KiB it blocks until released.
type stallConn struct {
	net.Conn
	mu      sync.Mutex
	armed   bool
	n       int
	stalled chan struct{} // closed when a read blocks
	release chan struct{}
}

func (c *stallConn) arm() {
	c.mu.Lock()
	c.armed = true
	c.mu.Unlock()
}

func (c *stallConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	armed, n := c.armed, c.n
	c.mu.Unlock()
	if armed {
		if n >= 4096 {
			select {
			case <-c.stalled:
			default:
				close(c.stalled)
			}
			<-c.release
		}
		b = b[:min(len(b), 1024)]
	}
	k, err := c.Conn.Read(b)
	if armed {
		c.mu.Lock()
		c.n += k
		c.mu.Unlock()
	}
	return k, err
}

// TestFlushReceiveBeingPlaced moves a QP to ERR while its responder places a SEND's
// payload into a receive it took (TCP fabric, the stream reader held up mid-payload). The
// receive completes WR_FLUSH_ERR, before the QP's other receive (rq) or alone, the SRQ's
// other receive staying in the SRQ (srq); nothing completes twice.
func TestFlushReceiveBeingPlaced(t *testing.T) {
	for _, mode := range []string{"rq", "srq"} {
		t.Run(mode, func(t *testing.T) {
			c := newHost(t, mustOpen(t), 1<<20)
			var s *host
			if mode == "srq" {
				s = newSRQHost(t, mustOpen(t), 1<<20, 8)
			} else {
				s = newHost(t, mustOpen(t), 1<<20)
			}
			defer c.close(t)
			defer s.close(t)
			sc := &stallConn{stalled: make(chan struct{}), release: make(chan struct{})}
			connectVia(t, c, s, func(conn net.Conn) net.Conn { sc.Conn = conn; return sc })
			recvs := []verbs.RecvWR{
				{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, 64<<10)}},
				{WRID: 2, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 64<<10, 64<<10)}},
			}
			if s.srq != nil {
				must(t, s.srq.PostRecv(recvs))
			} else {
				must(t, s.qp.PostRecv(recvs))
			}
			sc.arm()
			must(t, c.qp.PostSend([]verbs.SendWR{{WRID: 9, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 64<<10)}}}))
			select {
			case <-sc.stalled:
			case <-time.After(5 * time.Second):
				t.Fatal("the stream reader never reached the payload")
			}
			must(t, s.qp.Modify(verbs.QPAttr{State: verbs.QPStateError}))
			close(sc.release)
			want := []uint64{1, 2}
			if s.srq != nil {
				want = want[:1]
			}
			for _, id := range want {
				if wc := s.poll(t); wc.WRID != id || wc.Status != verbs.WCWRFlushErr || wc.QPNum != s.qp.Num() {
					t.Fatalf("completion %v, want receive %d flushed on QP %d", wc, id, s.qp.Num())
				}
			}
			time.Sleep(20 * time.Millisecond)
			if n, _ := s.cq.Poll(s.wcs[:]); n != 0 {
				t.Fatalf("%d more completions: %v", n, s.wcs[:n])
			}
		})
	}
}

// TestNotifyError: a QP on an SRQ has no receives of its own to flush, so its move to ERR
// is announced by NotifyError (verbs.ErrorNotifier): once, when the peer's end breaks the
// link, and at once for a QP already in ERR.
func TestNotifyError(t *testing.T) {
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			srv := newSRQHost(t, open("srv"), 4096, 8)
			cli := newHost(t, open("cli"), 4096)
			connect(t, cli, srv)
			fired := make(chan struct{}, 2)
			srv.qp.(verbs.ErrorNotifier).NotifyError(func() { fired <- struct{}{} })
			select {
			case <-fired:
				t.Fatal("notified while the QP is in RTS")
			case <-time.After(10 * time.Millisecond):
			}
			must(t, cli.qp.Destroy()) // the peer goes: its link ends, the server's QP fails
			cli.qp = nil
			select {
			case <-fired:
			case <-time.After(5 * time.Second):
				t.Fatalf("not notified of the move to ERR (QP state %v)", srv.qp.State())
			}
			srv.qp.(verbs.ErrorNotifier).NotifyError(func() { fired <- struct{}{} })
			select {
			case <-fired:
			case <-time.After(5 * time.Second):
				t.Fatal("a QP in ERR already: not notified")
			}
			if len(fired) != 0 {
				t.Error("notified twice")
			}
			srv.close(t)
			cli.qp, _ = cli.pd.CreateQP(verbs.QPInitAttr{SendCQ: cli.cq, RecvCQ: cli.cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
			cli.close(t)
		})
	}
}

// TestSRQTakeOrder: an SRQ hands out its receives in post order, and one created with
// AnyOrder newest first (a stack), in either case each posted receive exactly once, across
// wrap-around of its ring, with the limit event on both.
func TestSRQTakeOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		anyOrder bool
		want     []uint64
	}{
		{"post order", false, []uint64{0, 1, 2, 3, 4, 5, 6, 7}},
		{"any order", true, []uint64{3, 2, 5, 4, 7, 6, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const depth = 4
			s := &srq{attr: verbs.SRQAttr{MaxWR: depth, MaxSGE: 1, AnyOrder: tc.anyOrder}, ring: make([]rwqe, depth), limitCh: make(chan struct{}, 1)}
			next := uint64(0)
			post := func(k int) {
				t.Helper()
				for range k {
					if err := s.PostRecv([]verbs.RecvWR{{WRID: next, SGL: []verbs.SGE{{Length: 64}}}}); err != nil {
						t.Fatal(err)
					}
					next++
				}
			}
			var got []uint64
			take := func(k int) {
				t.Helper()
				for range k {
					var r rwqe
					if !s.take(&r) {
						t.Fatalf("take found no receive after %v", got)
					}
					if len(r.sges) != 1 || r.sges[0].Length != 64 {
						t.Fatalf("receive %d came with SGEs %v", r.wrid, r.sges)
					}
					got = append(got, r.wrid)
				}
			}
			post(depth) // 0-3: full
			if err := s.PostRecv([]verbs.RecvWR{{WRID: 99}}); !errors.Is(err, verbs.ErrQueueFull) {
				t.Fatalf("post to a full SRQ: %v, want ErrQueueFull", err)
			}
			take(2)
			post(2) // 4, 5: the ring wraps
			must(t, s.ArmLimit(3))
			take(2)
			select {
			case <-s.limitCh:
			default:
				t.Fatal("no limit event once fewer than 3 receives remained")
			}
			post(2) // 6, 7
			take(4)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("receives taken in order %v, want %v", got, tc.want)
			}
			var r rwqe
			if s.take(&r) {
				t.Fatalf("take found receive %d in an empty SRQ", r.wrid)
			}
		})
	}
}
