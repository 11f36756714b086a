package transport

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// BenchmarkCall measures echo calls of 64 B and 1 MiB at concurrency 1 and 32 over both
// soft fabrics, and a raw TCP ping-pong of the same sizes in the same run: the floor. Each
// reports its median round trip as p50-ns next to Go's mean ns/op.
//
//	go test -run '^$' -bench Call -benchmem -count 5 ./transport/
func BenchmarkCall(b *testing.B) {
	for _, size := range []int{64, 1 << 20} {
		for _, conc := range []int{1, 32} {
			name := fmt.Sprintf("%s/c%d", sizeName(size), conc)
			for _, fb := range fabrics {
				b.Run(fb.name+"/"+name, func(b *testing.B) { benchTransport(b, fb, size, conc) })
			}
			b.Run("rawtcp/"+name, func(b *testing.B) { benchRawTCP(b, size, conc) })
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dB", n)
}

// latencies records one duration per operation, without allocating in the loop.
type latencies struct {
	d []time.Duration
	n atomic.Int64
}

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, n)} }

func (l *latencies) add(d time.Duration) {
	if i := l.n.Add(1) - 1; int(i) < len(l.d) {
		l.d[i] = d
	}
}

func (l *latencies) report(b *testing.B) {
	d := l.d[:min(int(l.n.Load()), len(l.d))]
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds()), "p99-ns")
}

func benchTransport(b *testing.B, fb fabric, size, conc int) {
	e := newEnv(b, fb, echo, Config{})
	req := payload(size, 3)
	call := func() {
		var resp *Response
		var err error
		if size > e.conn.eager { // build the request in registered memory: no copy
			buf, gerr := e.client.pool.Get(context.Background(), size)
			if gerr != nil {
				b.Fatal(gerr)
			}
			copy(buf.Bytes(), req)
			resp, err = e.conn.CallBuf(context.Background(), buf)
		} else {
			resp, err = e.conn.Call(context.Background(), req)
		}
		if err != nil {
			b.Fatal(err)
		}
		if len(resp.Bytes()) != size {
			b.Fatalf("response of %d bytes", len(resp.Bytes()))
		}
		resp.Release()
	}
	for i := 0; i < 100; i++ {
		call()
	}
	lat := newLatencies(b.N)
	writes := newWriteCount(e)
	b.SetBytes(int64(2 * size))
	b.ReportAllocs()
	b.ResetTimer()
	if conc == 1 {
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			call()
			lat.add(time.Since(t0))
		}
	} else {
		b.SetParallelism((conc + 1) / 2)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				t0 := time.Now()
				call()
				lat.add(time.Since(t0))
			}
		})
	}
	b.StopTimer()
	lat.report(b)
	writes.report(b)
}

// writeCount reports the writes each side's soft device made on its streams per call
// (soft.Stats.Writes: a write(2) or writev(2) on TCP, however many frames it carries), and
// the client's NIC engine wake-ups: the structure of a call, beside its times.
type writeCount struct {
	c, s   *soft.Device
	c0, s0 soft.Stats
}

func newWriteCount(e *env) *writeCount {
	c, cok := e.cdev.(*soft.Device)
	s, sok := e.sdev.(*soft.Device)
	if !cok || !sok {
		return nil
	}
	return &writeCount{c: c, s: s, c0: c.Stats(), s0: s.Stats()}
}

func (w *writeCount) report(b *testing.B) {
	if w == nil {
		return
	}
	c, s, n := w.c.Stats(), w.s.Stats(), float64(b.N)
	b.ReportMetric(float64(c.Writes-w.c0.Writes)/n, "client-writes/op")
	b.ReportMetric(float64(s.Writes-w.s0.Writes)/n, "server-writes/op")
	b.ReportMetric(float64(c.EngineWakes-w.c0.EngineWakes)/n, "client-wakes/op")
	b.ReportMetric(float64(s.EngineWakes-w.s0.EngineWakes)/n, "server-wakes/op")
}

// benchRawTCP: conc connections, each a length-prefixed echo over loopback TCP. It does the
// application work benchTransport's calls do, so that the ratio is the transport's cost: the
// caller writes its request into its send buffer, and the server copies the request into
// its response (one payload copy on each side, which matters at 1 MiB).
func benchRawTCP(b *testing.B, size, conc int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				in, out := make([]byte, 4+size), make([]byte, 4+size)
				for {
					if _, err := io.ReadFull(c, in[:4]); err != nil {
						return
					}
					n := binary.LittleEndian.Uint32(in)
					if _, err := io.ReadFull(c, in[4:4+n]); err != nil {
						return
					}
					copy(out, in[:4+n]) // as the transport's echo builds its response
					if _, err := c.Write(out[:4+n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	conns := make(chan net.Conn, conc)
	for i := 0; i < conc; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		conns <- c
	}
	lat := newLatencies(b.N)
	req := payload(size, 3)
	pingpong := func(c net.Conn, msg, in []byte) {
		t0 := time.Now()
		copy(msg[4:], req) // as the transport's caller builds its request
		if _, err := c.Write(msg); err != nil {
			b.Error(err)
			return
		}
		if _, err := io.ReadFull(c, in); err != nil {
			b.Error(err)
			return
		}
		lat.add(time.Since(t0))
	}
	msg := binary.LittleEndian.AppendUint32(nil, uint32(size))
	msg = append(msg, req...)
	b.SetBytes(int64(2 * size))
	b.ReportAllocs()
	b.ResetTimer()
	if conc == 1 {
		c, in := <-conns, make([]byte, len(msg))
		for i := 0; i < b.N; i++ {
			pingpong(c, msg, in)
		}
	} else {
		b.SetParallelism((conc + 1) / 2)
		b.RunParallel(func(pb *testing.PB) {
			c, msg, in := <-conns, slices.Clone(msg), make([]byte, len(msg))
			defer func() { conns <- c }()
			for pb.Next() {
				pingpong(c, msg, in)
			}
		})
	}
	b.StopTimer()
	lat.report(b)
}

// BenchmarkCrossover times a call whose request and response are n bytes each, sent
// eagerly inside the SEND or exposed through a window and READ, to pick the default eager
// threshold (docs/tuning.md).
//
//	go test -run '^$' -bench Crossover -count 5 ./transport/
func BenchmarkCrossover(b *testing.B) {
	for _, fb := range fabrics {
		for _, n := range []int{1 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10} {
			for _, path := range []string{"eager", "window"} {
				b.Run(fmt.Sprintf("%s/%s/%s", fb.name, sizeName(n), path), func(b *testing.B) {
					cfg := Config{SlotSize: 128 << 10, EagerThreshold: 128<<10 - 32}
					if path == "window" {
						cfg.EagerThreshold = 1
					}
					e := newEnv(b, fb, echo, cfg)
					b.SetBytes(int64(2 * n))
					timeCalls(b, e.conn, payload(n, 1)).report(b)
				})
			}
		}
	}
}

// BenchmarkSmallBesideLarge times 64 B calls on a connection that two other callers keep
// busy with 16 MiB calls: how long a small call waits behind large transfers on the same
// queue pair (the soft NIC sends long READ responses in segments that other frames pass).
//
//	go test -run '^$' -bench SmallBesideLarge -benchtime 300x ./transport/
func BenchmarkSmallBesideLarge(b *testing.B) {
	for _, fb := range fabrics {
		b.Run(fb.name, func(b *testing.B) {
			e := newEnv(b, fb, echo, Config{})
			big, small := payload(16<<20, 1), payload(64, 2)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < 2; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						r, err := e.conn.Call(context.Background(), big)
						if err != nil {
							b.Error(err)
							return
						}
						r.Release()
					}
				}()
			}
			time.Sleep(50 * time.Millisecond) // let the large calls get going
			lat := timeCalls(b, e.conn, small)
			close(stop)
			wg.Wait()
			lat.report(b)
		})
	}
}

// timeCalls makes b.N calls of req on c, one at a time, and times each; the timer runs only
// around them.
func timeCalls(b *testing.B, c *Conn, req []byte) *latencies {
	lat := newLatencies(b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		r, err := c.Call(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		r.Release()
		lat.add(time.Since(t0))
	}
	b.StopTimer()
	return lat
}

// BenchmarkConnSetup measures setting a connection up and tearing it down on the soft TCP
// fabric, both sides in this process, and a refused one (what ConnRatePerHost and the
// connection limits cost the server per connection turned away). The CPU per setup bounds
// what a host's churn at ConnRatePerHost can take.
//
//	go test -run '^$' -bench ConnSetup -benchmem -count 5 ./transport/
func BenchmarkConnSetup(b *testing.B) {
	for _, refused := range []bool{false, true} {
		name := "setup"
		if refused {
			name = "refused"
		}
		b.Run(name, func(b *testing.B) {
			cfg := Config{ConnRatePerHost: 1e9, MaxConnsPerHost: 1 << 20}
			if refused {
				cfg.MaxConnsPerHost, cfg.ConnRatePerHost = 1, 1e-9
			}
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			e := newEnv(b, fabrics[1], echo, cfg)
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c, err := e.client.Dial(ctx, e.addr)
				if refused {
					if err == nil {
						b.Fatal("not refused")
					}
					continue
				}
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			b.StopTimer()
			// The server's side ends when it notices: let it, before the checks at cleanup.
			for deadline := time.Now().Add(10 * time.Second); e.server.Stats().Conns > 1 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		})
	}
}

// BenchmarkStream measures a server stream of 1 MiB chunks (each through a window of its
// own, READ by the receiver) over both soft fabrics, and a raw TCP bulk copy of the same
// chunks in the same run: the floor. MB/s is the throughput.
//
//	go test -run '^$' -bench Stream -benchmem -count 5 ./transport/
func BenchmarkStream(b *testing.B) {
	const chunk = 1 << 20
	for _, fb := range fabrics {
		b.Run(fb.name, func(b *testing.B) {
			src := payload(chunk, 5)
			h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
				st := w.Stream()
				n := int(binary.LittleEndian.Uint64(req))
				for i := 0; i < n; i++ {
					if err := st.Send(ctx, src); err != nil {
						return
					}
				}
			})
			e := newEnv(b, fb, h, Config{})
			b.SetBytes(chunk)
			b.ReportAllocs()
			b.ResetTimer()
			st, err := e.conn.OpenStream(context.Background(), binary.LittleEndian.AppendUint64(nil, uint64(b.N)))
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			for i := 0; i < b.N; i++ {
				if m, err := st.Recv(context.Background()); err != nil || len(m) != chunk {
					b.Fatalf("chunk %d: %d bytes, %v", i, len(m), err)
				}
			}
			if _, err := st.Recv(context.Background()); err != io.EOF {
				b.Fatalf("end: %v", err)
			}
		})
	}
	b.Run("rawtcp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			var n [8]byte
			if _, err := io.ReadFull(c, n[:]); err != nil {
				return
			}
			src := payload(chunk, 5)
			for i := uint64(0); i < binary.LittleEndian.Uint64(n[:]); i++ {
				if _, err := c.Write(src); err != nil {
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		b.SetBytes(chunk)
		b.ReportAllocs()
		b.ResetTimer()
		if _, err := c.Write(binary.LittleEndian.AppendUint64(nil, uint64(b.N))); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, chunk)
		for i := 0; i < b.N; i++ {
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}
