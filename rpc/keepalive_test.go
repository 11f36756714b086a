package rpc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"

	"net"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// proxy forwards TCP connections to target until freeze: then it stops moving bytes on
// the connections it has (a peer that hangs without closing) and serves only new ones.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	frozen chan struct{}
	done   chan struct{} // closed at cleanup: frozen pipes end
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, frozen: make(chan struct{}), done: make(chan struct{})}
	go p.serve()
	t.Cleanup(func() {
		close(p.done)
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

func (p *proxy) serve() {
	for {
		a, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			a.Close()
			continue
		}
		p.mu.Lock()
		frozen := p.frozen
		p.conns = append(p.conns, a, b)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				select {
				case <-frozen:
					<-p.done // hold the bytes, close nothing, until the test ends
					return
				default:
				}
				if err != nil {
					dst.Close()
					return
				}
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
		}
		go pipe(a, b)
		go pipe(b, a)
	}
}

// freeze hangs every connection made so far; later ones flow.
func (p *proxy) freeze() {
	p.mu.Lock()
	close(p.frozen)
	p.frozen = make(chan struct{})
	p.mu.Unlock()
}

// TestKeepaliveDetectsHungPeer: a peer that stops answering without closing is noticed by
// the keepalive ping, which fails the call in flight with Unavailable long before the
// transport's own timeout, and the client reconnects.
func TestKeepaliveDetectsHungPeer(t *testing.T) {
	c, _ := frozenClient(t, 10*time.Millisecond)
	svc := svcClient{c}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := svc.Echo(ctx, &Msg{Text: "hangs"})
	if !errors.Is(err, rpc.ErrUnavailable) || time.Since(t0) > 2*time.Second {
		t.Fatalf("call on a hung connection: %v after %v; want Unavailable within about keepalive interval + timeout", err, time.Since(t0))
	}
	// The client reconnects (through the proxy, whose new connections flow). A ping of the
	// new connection that misses its 100 ms on a loaded machine drops that one too, as it
	// should: the call is made again on the next.
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx2, cancel2 := context.WithDeadline(context.Background(), deadline)
		out := new(Msg)
		err := c.Invoke(ctx2, "/test.Svc/Echo", &Msg{Text: "after"}, out, rpc.WaitForReady())
		cancel2()
		if err == nil && out.Text == "after" {
			break
		}
		if !errors.Is(err, rpc.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("after reconnecting: %v (%q)", err, out.Text)
		}
		t.Logf("after reconnecting: %v (made again)", err)
	}
}

// TestKeepaliveWithCallsTimingOut: calls that keep being made on a hung connection, each
// timing out, do not keep the ping away (only a response counts as the connection
// working): the ping fails, the connection is dropped, and calls get Unavailable.
func TestKeepaliveWithCallsTimingOut(t *testing.T) {
	c, px := frozenClient(t, time.Second)
	svc := svcClient{c}
	for deadline := time.Now().Add(3 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := svc.Echo(ctx, &Msg{Text: "hangs"})
		cancel()
		if errors.Is(err, rpc.ErrUnavailable) {
			return // the keepalive dropped the hung connection
		}
		if err == nil {
			// The call went over a connection made after the freeze, which flows: on a
			// loaded machine a ping missed its 100 ms just before the freeze, and the
			// client had reconnected. Hang that one too and go on.
			t.Log("a call went through on a connection made after the freeze: freezing it too")
			px.freeze()
			deadline = time.Now().Add(3 * time.Second)
			continue
		}
		if !errors.Is(err, rpc.ErrDeadlineExceeded) {
			t.Fatalf("call on a hung connection: %v, want DeadlineExceeded until the ping drops it", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("calls that time out kept the keepalive ping away: the hung connection was never dropped")
		}
	}
}

// frozenClient returns a client (keepalive every 50 ms, 100 ms to answer; reconnection
// backoff from backoff) whose connection made one call and then hung: a proxy between it
// and the server stopped moving bytes without closing anything. The proxy comes back
// too, to hang connections made later.
func frozenClient(t *testing.T, backoff time.Duration) (*rpc.Client, *proxy) {
	t.Helper()
	e := start(t, nil)
	px := newProxy(t, e.addr)
	c, err := rpc.Dial(context.Background(), px.ln.Addr().String(),
		rpc.WithKeepalive(50*time.Millisecond, 100*time.Millisecond), rpc.WithBackoff(backoff, 5*backoff))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// On a loaded machine a ping can miss its 100 ms before the freeze too: the keepalive
	// then drops the connection, as it should, and the call fails Unavailable. Until one call
	// went through, the client reconnects (WaitForReady) and the call is made again.
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := c.Invoke(ctx, "/test.Svc/Echo", &Msg{Text: "before"}, new(Msg), rpc.WaitForReady())
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, rpc.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("the call before the freeze: %v", err)
		}
		t.Logf("the call before the freeze: %v (made again)", err)
	}
	px.freeze()
	return c, px
}

// TestKeepaliveTooManyPings: a client that pings an idle connection more often than the
// server's policy allows (by default, every two hours without a call in flight) is sent
// GOAWAY saying "too many pings": it logs that, pings half as often, and its calls go on
// over a new connection. A server that permits the pings keeps the connection.
func TestKeepaliveTooManyPings(t *testing.T) {
	logs := new(syncBuffer)
	logger := slog.New(slog.NewTextHandler(logs, nil))
	e := start(t, nil, rpc.WithKeepalive(20*time.Millisecond, time.Second), rpc.WithLogger(logger))
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "pinged too often"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no GOAWAY for pinging every 20ms; the client's log:\n%s", logs.String())
		}
	}
	for _, want := range []string{"too many pings", "this server allows a ping every 5m0s", "interval=40ms"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the client's log lacks %q:\n%s", want, logs.String())
		}
	}
	if n := e.srv.Stats().TooManyPings; n == 0 {
		t.Error("the server counted no client pinging too often")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := new(Msg)
	if err := e.client.Invoke(ctx, "/test.Svc/Echo", &Msg{Text: "after"}, out, rpc.WaitForReady()); err != nil || out.Text != "after" {
		t.Fatalf("a call after the GOAWAY: %+v, %v", out, err)
	}

	permissive := start(t, []rpc.ServerOption{rpc.WithKeepalivePolicy(transport.ServerKeepalive{MinPingInterval: time.Millisecond, PermitWithoutCalls: true})},
		rpc.WithKeepalive(20*time.Millisecond, time.Second))
	time.Sleep(300 * time.Millisecond) // about 15 pings
	if n := permissive.srv.Stats().TooManyPings; n != 0 {
		t.Errorf("a server that permits a ping every 1ms sent GOAWAY for pings every 20ms %d times", n)
	}
}

// TestMaxConnectionAgeCallsGoOn: a server's MaxConnectionAge sends every connection
// GOAWAY in turn; fail-fast calls and streams made across the rotations all succeed, as
// in gRPC: with one connection a call that finds the endpoint reconnecting waits for the
// redial, with lanes a lane takes the lost connection's place at once, and a call whose
// connection closed between its pick and its send (nothing sent) goes on another.
func TestMaxConnectionAgeCallsGoOn(t *testing.T) {
	quiet := rpc.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))) // no health service: a warning a connection
	for _, tc := range []struct {
		name string
		opts []rpc.DialOption
	}{
		{"one connection", []rpc.DialOption{rpc.WithLanes(1)}},
		{"two lanes", []rpc.DialOption{rpc.WithLanes(2)}},
		{"adaptive lanes", nil},
		{"health-checked", []rpc.DialOption{rpc.WithLanes(1), rpc.WithHealthCheck(""), quiet}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opt, seen := peersSeen()
			age := rpc.WithKeepalivePolicy(transport.ServerKeepalive{MaxConnectionAge: 50 * time.Millisecond, MaxConnectionAgeGrace: time.Second})
			e := start(t, []rpc.ServerOption{opt, age}, tc.opts...)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var failed []error
			stop := time.Now().Add(time.Second)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(stop); i++ {
						var err error
						if i%2 == 0 {
							_, err = e.svc.Sleep(context.Background(), &Msg{N: int64(100 * time.Microsecond)})
						} else { // a stream: opened as a call is sent
							for _, serr := range (streamsClient{e.client}).Count(context.Background(), &Msg{N: 2}) {
								if serr != nil {
									err = serr
									break
								}
							}
						}
						if err != nil {
							mu.Lock()
							failed = append(failed, err)
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			if len(failed) > 0 {
				t.Errorf("%d calls failed across the rotations, the first: %v", len(failed), failed[0])
			}
			if n := len(seen()); n < 4 {
				t.Errorf("calls came from %d connections in a second of 50 ms ages: want the rotations to have happened", n)
			}
		})
	}
}
