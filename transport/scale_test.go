package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// BenchmarkIdleConns opens n connections from one client transport to one server on the
// soft TCP fabric and reports what an idle connection costs: Go heap (both sides, this
// process holds both) and registered pool bytes in use (the server's side), the time to
// connect one, and the p50/p99 of 64 B calls on 4 hot connections among the idle ones
// beside the same calls with no idle connection. It does its work once: run it with
// -benchtime 1x.
//
//	go test -run '^$' -bench IdleConns -benchtime 1x ./transport/
func BenchmarkIdleConns(b *testing.B) {
	for _, n := range []int{100, 1000} {
		for _, shared := range []bool{false, true} {
			name := fmt.Sprintf("n%d/own-receives", n)
			if shared {
				name = fmt.Sprintf("n%d/shared-receives", n)
			}
			b.Run(name, func(b *testing.B) { benchIdleConns(b, n, shared) })
		}
	}
}

func scaleConfig(n int, shared bool) Config {
	cfg := Config{
		MaxConns: 2*n + 16, MaxConnsPerHost: 2*n + 16, ConnRatePerHost: 1e9,
		Pollers: 2, CQDepth: 1 << 20,
		Pool: pool.Config{MaxBytes: 8 << 30},
	}
	cfg.SharedReceives = -1 // each connection's own receives (not the TCP fabric's default)
	if shared {
		cfg.SharedReceives = 1024
	}
	return cfg
}

func benchIdleConns(b *testing.B, n int, shared bool) {
	e := newEnv(b, fabrics[1], echo, scaleConfig(n, shared))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	hot := []*Conn{e.conn}
	for len(hot) < 4 {
		c, err := e.client.Dial(ctx, e.addr)
		if err != nil {
			b.Fatal(err)
		}
		hot = append(hot, c)
	}
	alone := hotCalls(b, ctx, hot)
	heap0, used0 := heapInUse(), poolInUse(e.server)
	start := time.Now()
	idle := make([]*Conn, 0, n)
	for len(idle) < n {
		c, err := e.client.Dial(ctx, e.addr)
		if err != nil {
			b.Fatalf("idle connection %d: %v", len(idle), err)
		}
		idle = append(idle, c)
	}
	connect := time.Since(start) / time.Duration(n)
	// The server publishes its side a moment after the client's Dial returns.
	for deadline := time.Now().Add(time.Minute); e.server.Stats().Conns < n+4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("the server has %d connections, want %d", e.server.Stats().Conns, n+4)
		}
	}
	heap1, used1 := heapInUse(), poolInUse(e.server)
	among := hotCalls(b, ctx, hot)
	b.ReportMetric(float64(heap1-heap0)/float64(n), "heap-B/conn")
	b.ReportMetric(float64(used1-used0)/float64(n), "srv-reg-B/conn")
	b.ReportMetric(float64(connect.Microseconds()), "connect-us")
	b.ReportMetric(float64(alone[0].Microseconds()), "p50-alone-us")
	b.ReportMetric(float64(alone[1].Microseconds()), "p99-alone-us")
	b.ReportMetric(float64(among[0].Microseconds()), "p50-idle-us")
	b.ReportMetric(float64(among[1].Microseconds()), "p99-idle-us")
	for _, c := range append(idle, hot[1:]...) {
		c.Close()
	}
	for deadline := time.Now().Add(time.Minute); e.server.Stats().Conns > 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// hotCalls makes 2,000 64 B calls spread over conns, one at a time, and returns the
// p50 and p99.
func hotCalls(b *testing.B, ctx context.Context, conns []*Conn) [2]time.Duration {
	req := make([]byte, 64)
	lat := make([]time.Duration, 0, 2000)
	for i := 0; i < 2000; i++ {
		t0 := time.Now()
		resp, err := conns[i%len(conns)].Call(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Release()
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return [2]time.Duration{lat[len(lat)/2], lat[len(lat)*99/100]}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func poolInUse(t *Transport) int64 {
	var n int64
	for _, c := range t.Stats().Pool.Classes {
		n += c.BytesInUse
	}
	return n
}

// TestSharedReceives: with a shared receive queue on both sides, calls of every size work
// on several connections at once, a caller's unreleased responses and a handler's held
// request keep their slots until released, and at the end every slot is back (the env's
// checks: no pooled buffer left, no window bound). "overcommitted" has more messages in
// flight than the queue has slots: the sender's NIC retries the SEND that found it empty
// (RNR), which rxe mishandles (ibvKnown); "sized" never runs the queue empty.
func TestSharedReceives(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			for _, tc := range []struct {
				name  string
				slots int
			}{{"sized", 256}, {"overcommitted", 16}} {
				t.Run(tc.name, func(t *testing.T) { sharedReceives(t, fb, tc.slots) })
			}
		})
	}
}

func sharedReceives(t *testing.T, fb fabric, slots int) {
	e := newEnv(t, fb, echo, Config{SharedReceives: slots})
	e.allowRNR = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns := []*Conn{e.conn}
	for len(conns) < 4 {
		c, err := e.client.Dial(ctx, e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	sizes := []int{64, 4 << 10, 64 << 10}
	errc := make(chan error, 32)
	for g := 0; g < 32; g++ { // 32 callers: overcommitted, twice the slots
		go func() {
			c := conns[g%len(conns)]
			for i := 0; i < 40; i++ {
				req := make([]byte, sizes[(g+i)%len(sizes)])
				req[0], req[len(req)-1] = byte(g), byte(i)
				resp, err := c.Call(ctx, req)
				if err != nil {
					errc <- err
					return
				}
				ok := bytes.Equal(resp.Bytes(), req)
				resp.Release()
				if !ok {
					errc <- fmt.Errorf("caller %d call %d: wrong echo", g, i)
					return
				}
			}
			errc <- nil
		}()
	}
	for g := 0; g < 32; g++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	// Responses held beyond the call: their slots stay taken, the others serve.
	var held []*Response
	for i := 0; i < 8; i++ {
		resp, err := conns[i%len(conns)].Call(ctx, []byte("held"))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, resp)
	}
	if resp, err := e.conn.Call(ctx, []byte("beside them")); err != nil {
		t.Fatal(err)
	} else {
		resp.Release()
	}
	for _, r := range held {
		r.Release()
	}
	if st := e.server.Stats(); st.Conns != 4 {
		t.Fatalf("server connections %d, want 4", st.Conns)
	}
	if sd, ok := e.sdev.(*soft.Device); ok {
		t.Logf("the server's NIC sent %d RNR NAKs (a SEND that found the shared queue empty, retried)", sd.Stats().RNRNaks)
	}
}

// TestThousandConns: one server takes 1,000 connections with shared receives; each makes
// a call; an idle connection registers no memory on the server and costs under 64 KiB of
// Go heap a side; and closing them all gives everything back (the env's checks).
func TestThousandConns(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 connections take a few seconds")
	}
	const n = 1000
	cfg := scaleConfig(n, true)
	cfg.CQDepth = 1 << 18 // 2 pollers x 262,144: about 800 connections each at most
	e := newEnv(t, fabrics[1], echo, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	heap0, used0 := heapInUse(), poolInUse(e.server)
	conns := make([]*Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for len(conns) < n {
		c, err := e.client.Dial(ctx, e.addr)
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	for deadline := time.Now().Add(time.Minute); e.server.Stats().Conns < n+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server has %d connections, want %d", e.server.Stats().Conns, n+1)
		}
	}
	heap1, used1 := heapInUse(), poolInUse(e.server)
	perSide := float64(heap1-heap0) / n / 2 // both sides live in this process
	t.Logf("%d connections: %.1f KiB of Go heap a side each, %d registered bytes in use on the server each",
		n, perSide/1024, (used1-used0)/n)
	if perSide >= 64<<10 {
		t.Errorf("an idle connection costs %.1f KiB of Go heap a side, want under 64 KiB", perSide/1024)
	}
	if used1 != used0 {
		t.Errorf("1,000 idle connections hold %d registered bytes on the server, want none (shared receives, send slots on first use)", used1-used0)
	}
	for i, c := range conns {
		resp, err := c.Call(ctx, []byte("one of a thousand"))
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		resp.Release()
	}
}

// TestInlineHandlers: with handlers run on the reaping goroutine, calls of every size work
// with more callers than credits (the requests that find no credit to reserve go to the
// pool) and more large responses than windows (those are sent from goroutines of their
// own); at the end nothing is left bound or held (the env's checks).
func TestInlineHandlers(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, echo, Config{InlineHandlers: true, Credits: 8, Windows: 2})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			sizes := []int{64, 20 << 10, 256 << 10}
			errc := make(chan error, 24)
			for g := 0; g < 24; g++ {
				go func() {
					for i := 0; i < 20; i++ {
						req := make([]byte, sizes[(g+i)%len(sizes)])
						req[0], req[len(req)-1] = byte(g), byte(i)
						resp, err := e.conn.Call(ctx, req)
						if err != nil {
							errc <- err
							return
						}
						ok := resp.Status() == StatusOK && bytes.Equal(resp.Bytes(), req)
						resp.Release()
						if !ok {
							errc <- fmt.Errorf("caller %d call %d: status %d, wrong echo", g, i, resp.Status())
							return
						}
					}
					errc <- nil
				}()
			}
			for g := 0; g < 24; g++ {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestSharedSlotsCrowded: requests held by slow handlers keep their shared slots only
// while at most half of the queue is held; beyond that each is copied out and its slot
// reposted, so that one peer's slow calls cannot empty the queue every connection
// receives from. Without the copy the 17th slow call would meet an empty queue (RNR,
// retried forever) and never reach its handler. Calls are sent one at a time, each once
// the last reached its handler, so that the queue never runs empty on its own (RNR, which
// rxe mishandles) and the count is exact.
func TestSharedSlotsCrowded(t *testing.T) {
	const slots, slow = 16, 24
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			block, done := make(chan struct{}), make(chan struct{})
			defer close(done) // (before the env's cleanup, which waits for the handlers)
			h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
				if string(req) == "slow" {
					select {
					case <-block:
					case <-done:
					}
				}
				_ = w.Write(StatusOK, req)
			})
			e := newEnv(t, fb, h, Config{SharedReceives: slots, InlineBudget: -1})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			errc := make(chan error, slow)
			for i := 0; i < slow; i++ {
				go func() {
					resp, err := e.conn.Call(ctx, []byte("slow"))
					if err == nil {
						resp.Release()
					}
					errc <- err
				}()
				for e.server.Stats().Handlers < i+1 {
					if ctx.Err() != nil {
						t.Fatalf("slow call %d never reached its handler (%d shared slots held)", i+1, e.server.pollers[0].sharedHeld.Load())
					}
					time.Sleep(100 * time.Microsecond)
				}
			}
			if held := e.server.pollers[0].sharedHeld.Load(); held > slots/2+1 {
				t.Errorf("%d shared slots held by %d blocked requests, want at most %d", held, slow, slots/2+1)
			}
			if n := e.server.Stats().Unshared; n < slow-slots/2 {
				t.Errorf("%d requests copied out of their slots, want at least %d", n, slow-slots/2)
			}
			// Another connection is served meanwhile.
			other, err := e.client.Dial(ctx, e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			resp, err := other.Call(ctx, []byte("beside them"))
			if err != nil {
				t.Fatalf("a call beside the slow ones: %v", err)
			}
			resp.Release()
			for i := 0; i < slow; i++ { // one at a time: the responses never crowd the client's queue
				block <- struct{}{}
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestSharedReceivesDeadPeer: on the soft TCP fabric (whose stream is the QP's wire, so
// there is no bootstrap connection to watch) a connection on the shared queue has no
// receives of its own to flush when its QP fails: the provider's error notice
// (verbs.ErrorNotifier) must fail it at once, not the housekeeping tick's check (15 s
// with this lease).
func TestSharedReceivesDeadPeer(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	e := newEnv(t, fabrics[1], blockingHandler(block), Config{Lease: time.Minute})
	if !e.conn.shared() {
		t.Fatal("the soft TCP fabric's default is not shared receives")
	}
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() {
			_, err := e.conn.Call(context.Background(), []byte("small: nothing of it in flight"))
			errs <- err
		}()
	}
	for e.conn.InFlight() < 4 {
		time.Sleep(time.Millisecond)
	}
	e.serverConn(t).Close()
	for i := 0; i < 4; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("call: %v, want ErrUnavailable", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a call did not fail within 5 s of its peer's end")
		}
	}
}
