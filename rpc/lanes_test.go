package rpc_test

import (
	"context"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// peersSeen returns a server option that records the address of every call's caller, and
// the set it fills.
func peersSeen() (rpc.ServerOption, func() map[string]int) {
	var mu sync.Mutex
	seen := map[string]int{}
	opt := rpc.WithUnaryInterceptor(func(ctx context.Context, req any, info *rpc.UnaryServerInfo, h rpc.UnaryHandler) (any, error) {
		if p, ok := rpc.PeerFromContext(ctx); ok {
			mu.Lock()
			seen[p.Addr.String()]++
			mu.Unlock()
		}
		return h(ctx, req)
	})
	return opt, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps(seen)
	}
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// waitLanes waits until the client holds want lanes to its one endpoint.
func waitLanes(t *testing.T, c *rpc.Client, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		got := c.Lanes()
		if len(got) == 1 && got[0] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client holds %v lanes, want [%d]", got, want)
		}
	}
}

// callMany makes n calls from each of g goroutines, each sleeping d on the server.
func callMany(t *testing.T, svc Svc, g, n int, d time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < n; j++ {
				if _, err := svc.Sleep(context.Background(), &Msg{N: int64(d)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestLanesPinned: WithLanes(4) keeps four connections to the endpoint; calls from many
// goroutines, each sleeping on the server so that they overlap, are spread over all four.
func TestLanesPinned(t *testing.T) {
	opt, seen := peersSeen()
	e := start(t, []rpc.ServerOption{opt}, rpc.WithLanes(4))
	waitLanes(t, e.client, 4)
	callMany(t, e.svc, 8, 50, 100*time.Microsecond)
	got := seen()
	if len(got) != 4 {
		t.Fatalf("400 calls came from %d connections (%v), want the 4 lanes", len(got), got)
	}
	for addr, n := range got {
		if n < 60 || n > 140 {
			t.Errorf("lane %s carried %d of 400 calls, want about 100 (%v)", addr, n, got)
		}
	}
}

// TestLanesLightLoad: one caller at a time keeps to the endpoint's own connection, its
// other lanes idle (drawn at random, each lane's reader would see its answers calls apart).
func TestLanesLightLoad(t *testing.T) {
	opt, seen := peersSeen()
	e := start(t, []rpc.ServerOption{opt}, rpc.WithLanes(4))
	waitLanes(t, e.client, 4)
	callMany(t, e.svc, 1, 40, 0)
	if got := seen(); len(got) != 1 {
		t.Fatalf("40 calls one at a time came from %d connections (%v), want 1", len(got), got)
	}
}

// TestLanesAdaptive: a client without WithLanes starts with one connection, opens more
// while its calls in flight pass two a lane, up to GOMAXPROCS, and calls use them all.
func TestLanesAdaptive(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3)) // the cap: 3 lanes, on any machine
	opt, seen := peersSeen()
	e := start(t, []rpc.ServerOption{opt})
	callMany(t, e.svc, 1, 20, 0)
	if got := e.client.Lanes(); !slices.Equal(got, []int{1}) {
		t.Fatalf("one caller at a time: %v lanes, want [1]", got)
	}
	callMany(t, e.svc, 24, 20, time.Millisecond) // 24 in flight: 8 a lane at 3
	waitLanes(t, e.client, 3)
	before := seen()
	callMany(t, e.svc, 12, 20, time.Millisecond)
	after := seen()
	used := 0
	for addr, n := range after {
		if n > before[addr] {
			used++
		}
	}
	if used != 3 {
		t.Errorf("the last 240 calls took %d connections, want the 3 lanes (%v then %v)", used, before, after)
	}
}

// TestLanesRedial: lanes that fail (the server stops) are redialed once a server is back
// on the address, and calls use them all again; then a graceful stop sends GOAWAY on
// every lane without failing the calls in flight on them.
func TestLanesRedial(t *testing.T) {
	opt, seen := peersSeen()
	e := start(t, []rpc.ServerOption{opt}, rpc.WithLanes(3), rpc.WithBackoff(5*time.Millisecond, 20*time.Millisecond))
	waitLanes(t, e.client, 3)
	e.srv.Stop()
	for deadline := time.Now().Add(10 * time.Second); e.client.Stats().Conns > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the client still holds %d connections after the server stopped", e.client.Stats().Conns)
		}
	}
	srv2 := rpc.NewServer(deviceServerOpts(t, opt)...)
	srv2.RegisterService(&svcDesc, e.impl)
	ln, err := net.Listen("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv2.Serve(ln) }()
	waitLanes(t, e.client, 3)
	before := seen()
	callMany(t, e.svc, 6, 20, 0)
	if got := len(seen()) - len(before); got != 3 {
		t.Errorf("after the restart calls came from %d new connections, want the 3 lanes redialed", got)
	}
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ { // in flight on every lane during GracefulStop
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.svc.Sleep(context.Background(), &Msg{N: int64(100 * time.Millisecond)}); err != nil {
				t.Errorf("a call in flight during GracefulStop: %v", err)
			}
		}()
	}
	// GracefulStop once all six run: a call sent after the GOAWAY is not this test's.
	for deadline := time.Now().Add(10 * time.Second); total(seen())-total(before) < 120+6; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server took %d of the 6 calls", total(seen())-total(before)-120)
		}
	}
	srv2.GracefulStop()
	wg.Wait()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestLanesOverHostLimit: each lane is a connection to the server's limits. A client
// pinned to four lanes against a server that takes two connections from a host calls over
// the two it has, every call answered; the server turns the other lanes away and counts
// them, and the client keeps asking for them (with its backoff) without failing a call.
func TestLanesOverHostLimit(t *testing.T) {
	opt, seen := peersSeen()
	limit := rpc.WithTransport(transport.Config{MaxConnsPerHost: 2})
	e := start(t, []rpc.ServerOption{opt, limit}, rpc.WithLanes(4), rpc.WithBackoff(5*time.Millisecond, 20*time.Millisecond))
	waitLanes(t, e.client, 2)
	callMany(t, e.svc, 8, 25, 100*time.Microsecond) // each failed call is an error
	if got := seen(); len(got) != 2 {
		t.Errorf("200 calls came from %d connections (%v), want the 2 the server takes", len(got), got)
	}
	if got := e.client.Lanes(); !slices.Equal(got, []int{2}) {
		t.Errorf("the client holds %v lanes, want [2]: the server's limit", got)
	}
	for deadline := time.Now().Add(10 * time.Second); e.srv.Stats().Refused < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server refused %d connections, want the lanes beyond its limit, again and again", e.srv.Stats().Refused)
		}
	}
}

// TestLanesFollowTheEndpoint: lanes are dialed only once the endpoint's own connection is
// up. A server that never answers a handshake holds the first dial; a client pinned to
// four lanes must not dial the others beside it (against a server limiting connections
// from a host, lanes dialed first could take every place and keep the endpoint down).
func TestLanesFollowTheEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, nc) // never answered: the dial waits for its handshake
			mu.Unlock()
		}
	}()
	base := runtime.NumGoroutine()
	client, err := rpc.NewClient(ln.Addr().String(), rpc.WithLanes(4))
	if err != nil {
		t.Fatal(err)
	}
	dialed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(held)
	}
	for deadline := time.Now().Add(10 * time.Second); dialed() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // time for a lane's dial, were one made
	if n := dialed(); n != 1 {
		t.Errorf("the client dialed %d connections while its first was not up, want 1", n)
	}
	if err := client.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	_ = ln.Close()
	<-accepted
	for _, nc := range held {
		_ = nc.Close()
	}
	leakcheck.Wait(t, base)
}
