package soft

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// benchPair connects two hosts on the named fabric.
func benchPair(b *testing.B, fabric string, size int) (c, s *host) {
	open := fabrics(b)[fabric]
	c, s = newHost(b, open("c"), size), newHost(b, open("s"), size)
	connect(b, c, s)
	b.Cleanup(func() { s.close(b); c.close(b) })
	return c, s
}

// spin waits for one completion the way an adaptive poller does: it polls, yielding the
// processor after an empty poll, and after a short while arms the CQ and parks on its
// event channel. Spinning (even with Gosched) for long keeps the Go scheduler from polling
// the network, which starves the TCP fabric's stream readers.
func spin(b *testing.B, cq verbs.CQ, wcs []verbs.WorkCompletion) verbs.WorkCompletion {
	for i := 0; ; i++ {
		n, err := cq.Poll(wcs[:1])
		if err != nil {
			b.Fatal(err)
		}
		if n == 1 {
			if wcs[0].Status != verbs.WCSuccess {
				b.Fatalf("completion %v", wcs[0])
			}
			return wcs[0]
		}
		if i < spinPolls {
			runtime.Gosched()
			continue
		}
		if err := cq.ReqNotify(); err != nil {
			b.Fatal(err)
		}
		if n, _ := cq.Poll(wcs[:1]); n == 1 {
			return wcs[0]
		}
		<-cq.Notify()
	}
}

const spinPolls = 32

// BenchmarkPostSend measures posting a 64-byte inline SEND on the in-process fabric,
// including its transfer into a receive: SENDs are unsignaled but for every 32nd, whose
// completion (which also retires the 31 before it) the poster waits for, as RDMA
// applications post. A goroutine reposts the receiver's buffers.
func BenchmarkPostSend(b *testing.B) {
	c, s := benchPair(b, "inproc", 1<<16)
	recv := []verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, 64)}}}
	for i := 0; i < 200; i++ {
		must(b, s.qp.PostRecv(recv))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the receiver: repost what arrives
		defer close(done)
		wcs := make([]verbs.WorkCompletion, 32)
		for {
			n, _ := s.cq.Poll(wcs)
			for i := 0; i < n; i++ {
				if err := s.qp.PostRecv(recv); err != nil {
					return
				}
			}
			if n == 0 {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()
	unsignaled := []verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 64)}}}
	signaled := []verbs.SendWR{{WRID: 3, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 64)}}}
	var wc [1]verbs.WorkCompletion
	b.ReportAllocs()
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		wr := unsignaled
		if i%32 == 0 || i == b.N {
			wr = signaled
		}
		if err := c.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if i%32 == 0 || i == b.N {
			spin(b, c.cq, wc[:])
		}
	}
}

// BenchmarkRecvPingPong measures a 64-byte SEND ping-pong, each side's receives taken
// from its QP's own receive queue (rq) or from an SRQ (srq): the client sends, the server
// echoes from the receive's completion, and each side reposts the receive it used. The
// SENDs are inline and unsignaled, so that the only completions are the receives.
func BenchmarkRecvPingPong(b *testing.B) {
	for _, fabric := range []string{"inproc", "tcp"} {
		for _, mode := range []string{"rq", "srq"} {
			b.Run(fabric+"/"+mode, func(b *testing.B) { benchPingPong(b, fabric, mode == "srq") })
		}
	}
}

func benchPingPong(b *testing.B, fabric string, srq bool) {
	open := fabrics(b)[fabric]
	var c, s *host
	if srq {
		c, s = newSRQHost(b, open("c"), 1<<16, 64), newSRQHost(b, open("s"), 1<<16, 64)
	} else {
		c, s = newHost(b, open("c"), 1<<16), newHost(b, open("s"), 1<<16)
	}
	connect(b, c, s)
	b.Cleanup(func() { s.close(b); c.close(b) })
	// repost gives a receive back to where it came from; each side keeps 32 posted.
	repost := func(h *host, wrs []verbs.RecvWR) error {
		if h.srq != nil {
			return h.srq.PostRecv(wrs)
		}
		return h.qp.PostRecv(wrs)
	}
	for _, h := range []*host{c, s} {
		for i := 0; i < 32; i++ {
			must(b, repost(h, []verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(h.mr, i*64, 64)}}}))
		}
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // the server: echo every message from its receive's completion
		echo := []verbs.SendWR{{WRID: 9, Opcode: verbs.WRSend, Flags: verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 4096, 64)}}}
		rwr := []verbs.RecvWR{{SGL: []verbs.SGE{{Length: 64, LKey: s.mr.LKey()}}}}
		wcs := make([]verbs.WorkCompletion, 16)
		for idle := 0; ; {
			n, err := s.cq.Poll(wcs)
			if err != nil {
				done <- err
				return
			}
			if n == 0 {
				if idle++; idle < spinPolls {
					runtime.Gosched()
					continue
				}
				idle = 0
				if err := s.cq.ReqNotify(); err != nil {
					done <- err
					return
				}
				if n, _ = s.cq.Poll(wcs); n == 0 {
					select {
					case <-s.cq.Notify():
						continue
					case <-stop:
						done <- nil
						return
					}
				}
			}
			for _, wc := range wcs[:n] {
				if wc.Status != verbs.WCSuccess {
					done <- fmt.Errorf("server: %v", wc)
					return
				}
				rwr[0].WRID, rwr[0].SGL[0].Addr = wc.WRID, s.mr.Addr()+wc.WRID*64
				if err := repost(s, rwr); err != nil {
					done <- err
					return
				}
				if err := s.qp.PostSend(echo); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	ping := []verbs.SendWR{{WRID: 8, Opcode: verbs.WRSend, Flags: verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 4096, 64)}}}
	rwr := []verbs.RecvWR{{SGL: []verbs.SGE{{Length: 64, LKey: c.mr.LKey()}}}}
	var wc [1]verbs.WorkCompletion
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.qp.PostSend(ping); err != nil {
			b.Fatal(err)
		}
		w := spin(b, c.cq, wc[:])
		rwr[0].WRID, rwr[0].SGL[0].Addr = w.WRID, c.mr.Addr()+w.WRID*64
		if err := repost(c, rwr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPollCQ measures polling a completion queue: empty, and holding completions.
func BenchmarkPollCQ(b *testing.B) {
	d, _ := OpenTCP("poll")
	c := newCQ(d, 1024)
	wcs := make([]verbs.WorkCompletion, 16)
	b.Run("empty", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if n, _ := c.Poll(wcs); n != 0 {
				b.Fatal(n)
			}
		}
	})
	b.Run("one", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			c.push(verbs.WorkCompletion{WRID: uint64(i)})
			if n, _ := c.Poll(wcs); n != 1 {
				b.Fatal(n)
			}
		}
	})
}

// BenchmarkRead measures one signaled RDMA READ at a time, posted and polled, over each
// fabric, beside a raw TCP request/response moving the same bytes in the same run.
func BenchmarkRead(b *testing.B) {
	for _, size := range []int{64, 1 << 20} {
		for _, fabric := range []string{"inproc", "tcp"} {
			b.Run(fabric+"/"+sizeName(size), func(b *testing.B) {
				c, s := benchPair(b, fabric, 2*size+4096)
				rd := []verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{verbs.SGEFor(s.mr, size, size)}, RemoteAddr: c.mr.Addr(), RKey: c.mr.RKey()}}
				var wc [1]verbs.WorkCompletion
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := s.qp.PostSend(rd); err != nil {
						b.Fatal(err)
					}
					spin(b, s.cq, wc[:])
				}
			})
		}
		b.Run("rawtcp/"+sizeName(size), func(b *testing.B) { benchRawTCP(b, size) })
	}
}

// benchRawTCP is the floor: a 16-byte request over loopback TCP answered with size bytes.
func benchRawTCP(b *testing.B, size int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		req, resp := make([]byte, 16), make([]byte, size)
		for {
			if _, err := io.ReadFull(conn, req); err != nil {
				return
			}
			if _, err := conn.Write(resp); err != nil {
				return
			}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	req, resp := make([]byte, 16), make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := conn.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(conn, resp); err != nil {
			b.Fatal(err)
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return itoa(n>>20) + "MiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
