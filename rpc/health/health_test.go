package health_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/health"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// who is a one-method service that says which server answered, so that tests can see
// where a client's calls go.
type whoReq struct{}
type whoResp struct{ Name string }

type whoServer struct{ name string }

var whoDesc = rpc.ServiceDesc{
	ServiceName: "test.Who",
	Methods: []rpc.MethodDesc{{MethodName: "Name", Handler: func(srv any, ctx context.Context, dec func(any) error, _ rpc.UnaryServerInterceptor) (any, error) {
		if err := dec(new(whoReq)); err != nil {
			return nil, err
		}
		return &whoResp{Name: srv.(*whoServer).name}, nil
	}}},
}

func who(ctx context.Context, c *rpc.Client, opts ...rpc.CallOption) (string, error) {
	var out whoResp
	if err := c.Invoke(ctx, "/test.Who/Name", &whoReq{}, &out, opts...); err != nil {
		return "", err
	}
	return out.Name, nil
}

type server struct {
	srv  *rpc.Server
	hs   *health.Server // nil: no health service
	addr string
}

// startServer serves the who service, named name, and the health service if withHealth,
// on a loopback port (addr if not "") until the test ends.
func startServer(t *testing.T, name, addr string, withHealth bool) *server {
	t.Helper()
	// The clients of these tests ping every few hundred milliseconds (WithKeepalive):
	// the servers permit it, as gRPC's must (the default policy would send GOAWAY).
	s := &server{srv: rpc.NewServer(rpc.WithKeepalivePolicy(transport.ServerKeepalive{MinPingInterval: time.Millisecond, PermitWithoutCalls: true}))}
	s.srv.RegisterService(&whoDesc, &whoServer{name: name})
	if withHealth {
		s.hs = health.Register(s.srv)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	var err error
	if path, ok := shm.ParseTarget(addr); ok {
		ln, err = shm.Listen(path, shm.Config{})
	} else {
		ln, err = net.Listen("tcp", addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(ln) }()
	t.Cleanup(func() {
		s.srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, target string, opts ...rpc.DialOption) *rpc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestServingStatusString(t *testing.T) {
	for _, tc := range []struct {
		s    health.ServingStatus
		want string
	}{
		{health.Unknown, "UNKNOWN"}, {health.Serving, "SERVING"}, {health.NotServing, "NOT_SERVING"},
		{health.ServiceUnknown, "SERVICE_UNKNOWN"}, {7, "ServingStatus(7)"},
	} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("%d.String() = %q, want %q", int32(tc.s), got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	leakcheck.Check(t)
	s := startServer(t, "a", "", true)
	hc := health.NewHealthClient(dial(t, s.addr))
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		do      func()
		service string
		want    health.ServingStatus
		code    rpc.Code
	}{
		{"server by default", nil, "", health.Serving, rpc.OK},
		{"unknown service", nil, "kv.KV", 0, rpc.NotFound},
		{"set serving", func() { s.hs.SetServingStatus("kv.KV", health.Serving) }, "kv.KV", health.Serving, rpc.OK},
		{"set not serving", func() { s.hs.SetServingStatus("kv.KV", health.NotServing) }, "kv.KV", health.NotServing, rpc.OK},
		{"others unchanged", nil, "", health.Serving, rpc.OK},
		{"shutdown: the server", func() { s.hs.Shutdown() }, "", health.NotServing, rpc.OK},
		{"shutdown: a service", func() { s.hs.SetServingStatus("other", health.Serving) }, "other", 0, rpc.NotFound},
		{"shutdown: sets ignored", func() { s.hs.SetServingStatus("kv.KV", health.Serving) }, "kv.KV", health.NotServing, rpc.OK},
		{"resume: the server", func() { s.hs.Resume() }, "", health.Serving, rpc.OK},
		{"resume: a service", nil, "kv.KV", health.Serving, rpc.OK},
		{"resume: sets taken", func() { s.hs.SetServingStatus("kv.KV", health.NotServing) }, "kv.KV", health.NotServing, rpc.OK},
	} {
		if tc.do != nil {
			tc.do()
		}
		resp, err := hc.Check(ctx, &health.CheckRequest{Service: tc.service})
		if code := rpc.CodeOf(err); code != tc.code {
			t.Fatalf("%s: Check(%q) = %v, want code %v", tc.name, tc.service, err, tc.code)
		}
		if tc.code == rpc.NotFound && !strings.Contains(err.Error(), tc.service) {
			t.Errorf("%s: the error does not name the service: %v", tc.name, err)
		}
		if err == nil && resp.Status != tc.want {
			t.Errorf("%s: Check(%q) = %v, want %v", tc.name, tc.service, resp.Status, tc.want)
		}
	}
}

// next receives one status from a watch, or fails the test after d.
func next(t *testing.T, ch <-chan health.ServingStatus, d time.Duration) health.ServingStatus {
	t.Helper()
	select {
	case s, ok := <-ch:
		if !ok {
			t.Fatal("the watch ended")
		}
		return s
	case <-time.After(d):
		t.Fatalf("no status within %v", d)
	}
	return 0
}

// watch runs a client Watch of service in a goroutine, and sends what it yields on the
// returned channel until ctx ends; errc gets the error that ended it, if any.
func watch(ctx context.Context, hc *health.HealthClient, service string) (<-chan health.ServingStatus, <-chan error) {
	ch, errc := make(chan health.ServingStatus, 16), make(chan error, 1)
	go func() {
		defer close(ch)
		for resp, err := range hc.Watch(ctx, &health.CheckRequest{Service: service}) {
			if err != nil {
				errc <- err
				return
			}
			ch <- resp.Status
		}
	}()
	return ch, errc
}

func TestWatch(t *testing.T) {
	leakcheck.Check(t)
	s := startServer(t, "a", "", true)
	s.hs.SetServingStatus("kv.KV", health.Serving)
	hc := health.NewHealthClient(dial(t, s.addr))
	for _, tc := range []struct {
		name    string
		service string
		initial health.ServingStatus
		change  func()
		want    []health.ServingStatus
	}{
		{"a change", "kv.KV", health.Serving, func() { s.hs.SetServingStatus("kv.KV", health.NotServing) },
			[]health.ServingStatus{health.NotServing}},
		{"unknown, then set", "later", health.ServiceUnknown, func() { s.hs.SetServingStatus("later", health.Serving) },
			[]health.ServingStatus{health.Serving}},
		{"the same status again: nothing", "kv.KV", health.NotServing, func() {
			s.hs.SetServingStatus("kv.KV", health.NotServing)
			s.hs.SetServingStatus("kv.KV", health.Serving)
		}, []health.ServingStatus{health.Serving}},
		{"shutdown and resume", "", health.Serving, func() {
			s.hs.Shutdown()
			time.Sleep(50 * time.Millisecond) // delivered apart, not merged
			s.hs.Resume()
		}, []health.ServingStatus{health.NotServing, health.Serving}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, errc := watch(ctx, hc, tc.service)
			if got := next(t, ch, 5*time.Second); got != tc.initial {
				t.Fatalf("initial status %v, want %v", got, tc.initial)
			}
			tc.change()
			for _, want := range tc.want {
				if got := next(t, ch, 5*time.Second); got != want {
					t.Fatalf("status %v, want %v", got, want)
				}
			}
			select {
			case got := <-ch:
				t.Fatalf("an extra status %v", got)
			case err := <-errc:
				t.Fatalf("the watch failed: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}

// A watcher that does not read must not hold up SetServingStatus, and gets the latest
// status when it reads again, without the ones in between.
func TestWatchSlowWatcher(t *testing.T) {
	leakcheck.Check(t)
	hs := health.NewServer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, release := make(chan struct{}), make(chan struct{})
	got := make(chan health.ServingStatus, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n := 0
		for resp, err := range hs.Watch(ctx, &health.CheckRequest{Service: "svc"}) {
			if err != nil {
				t.Error(err)
				return
			}
			got <- resp.Status
			if n++; n == 1 {
				close(first)
				<-release // a watcher whose sends are stuck
			}
		}
	}()
	<-first
	setDone := make(chan struct{})
	go func() {
		defer close(setDone)
		for i := range 10000 {
			hs.SetServingStatus("svc", health.ServingStatus(1+i%2))
		}
		hs.SetServingStatus("svc", health.NotServing)
	}()
	select {
	case <-setDone:
	case <-time.After(10 * time.Second):
		t.Fatal("SetServingStatus blocked on a watcher that does not read")
	}
	close(release)
	if s := <-got; s != health.ServiceUnknown {
		t.Fatalf("first status %v, want SERVICE_UNKNOWN", s)
	}
	if s := next(t, got, 5*time.Second); s != health.NotServing {
		t.Fatalf("after the backlog: %v, want the latest, NOT_SERVING", s)
	}
	select {
	case s := <-got:
		t.Fatalf("an older status after the latest: %v", s)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
}

// A client that breaks out of Watch leaves no handler running on the server and no
// window bound.
func TestWatchCancel(t *testing.T) {
	leakcheck.Check(t)
	s := startServer(t, "a", "", true)
	c := dial(t, s.addr)
	hc := health.NewHealthClient(c)
	for range 3 {
		n := 0
		for resp, err := range hc.Watch(context.Background(), &health.CheckRequest{}) {
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != health.Serving {
				t.Fatalf("status %v", resp.Status)
			}
			n++
			break
		}
		if n != 1 {
			t.Fatalf("%d statuses", n)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ss, cs := s.srv.Stats(), c.Stats()
		if ss.Handlers == 0 && ss.WindowsExposed == 0 && cs.WindowsExposed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the watches: %d handlers running, %d server and %d client windows bound", ss.Handlers, ss.WindowsExposed, cs.WindowsExposed)
		}
		time.Sleep(time.Millisecond)
	}
	// The server's watcher is gone too: setting a status does not wait for it.
	s.hs.SetServingStatus("", health.NotServing)
}

// spread makes n calls and counts them by server.
func spread(t *testing.T, c *rpc.Client, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		name, err := who(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		got[name]++
	}
	return got
}

// waitOnly waits until n calls in a row go to want, for at most d, and returns how long
// it took. A call that fails with Unavailable (one sent on a connection as its server
// stopped) breaks the run.
func waitOnly(t *testing.T, c *rpc.Client, want string, n int, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for run := 0; run < n; {
		name, err := who(context.Background(), c)
		if err != nil && !errors.Is(err, rpc.ErrUnavailable) {
			t.Fatal(err)
		}
		if err == nil && name == want {
			run++
		} else {
			run = 0
		}
		if time.Since(start) > d {
			t.Fatalf("calls still went to %s after %v (%v)", name, d, err)
		}
	}
	return time.Since(start)
}

func TestHealthCheckBalancing(t *testing.T) {
	for _, tc := range []struct {
		name     string
		balancer rpc.Balancer
		service  string
	}{
		{"round robin, the server", rpc.RoundRobin, ""},
		{"least outstanding, a service", rpc.LeastOutstanding, "kv.KV"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			a, b := startServer(t, "a", "", true), startServer(t, "b", "", true)
			if tc.service != "" {
				a.hs.SetServingStatus(tc.service, health.Serving)
				b.hs.SetServingStatus(tc.service, health.Serving)
			}
			c := dial(t, a.addr+","+b.addr, rpc.WithHealthCheck(tc.service), rpc.WithBalancer(tc.balancer))
			waitBoth(t, c)
			a.hs.SetServingStatus(tc.service, health.NotServing)
			waitOnly(t, c, "b", 20, 5*time.Second)
			if got := spread(t, c, 50); got["a"] != 0 {
				t.Fatalf("calls went to the server marked NOT_SERVING: %v", got)
			}
			a.hs.SetServingStatus(tc.service, health.Serving)
			waitBoth(t, c)
		})
	}
}

// waitBoth waits until calls go to both servers.
func waitBoth(t *testing.T, c *rpc.Client) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := spread(t, c, 20)
		if got["a"] > 0 && got["b"] > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls do not spread over both servers: %v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The health Watch reports NOT_SERVING within one keepalive interval when a service is
// marked down: both a caller's Watch and the client's health check, whose endpoint then
// takes no calls.
func TestHealthWatchReportsNotServingWithinKeepalive(t *testing.T) {
	leakcheck.Check(t)
	const interval = 200 * time.Millisecond
	a, b := startServer(t, "a", "", true), startServer(t, "b", "", true)
	for _, s := range []*server{a, b} {
		s.hs.SetServingStatus("svc", health.Serving)
	}
	c := dial(t, a.addr+","+b.addr, rpc.WithHealthCheck("svc"), rpc.WithKeepalive(interval, time.Second))
	waitBoth(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, _ := watch(ctx, health.NewHealthClient(dial(t, a.addr)), "svc")
	if s := next(t, ch, 5*time.Second); s != health.Serving {
		t.Fatalf("initial status %v", s)
	}
	start := time.Now()
	a.hs.SetServingStatus("svc", health.NotServing)
	if s := next(t, ch, interval); s != health.NotServing {
		t.Fatalf("status %v, want NOT_SERVING", s)
	}
	if d := waitOnly(t, c, "b", 10, interval); time.Since(start) > interval {
		t.Fatalf("the client skipped the endpoint after %v (%v calling), more than the keepalive interval %v", time.Since(start), d, interval)
	}
}

// A server without the health service counts as healthy, and the client says so in
// its log.
func TestHealthCheckNoHealthService(t *testing.T) {
	leakcheck.Check(t)
	a, b := startServer(t, "a", "", true), startServer(t, "b", "", false)
	var log syncBuffer
	c := dial(t, a.addr+","+b.addr, rpc.WithHealthCheck(""), rpc.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	waitBoth(t, c)
	if !strings.Contains(log.String(), "no health service") || !strings.Contains(log.String(), b.addr) {
		t.Fatalf("no log line naming %s: %q", b.addr, log.String())
	}
	if strings.Contains(log.String(), a.addr) {
		t.Fatalf("a log line about the server with the health service: %q", log.String())
	}
	a.hs.SetServingStatus("", health.NotServing)
	waitOnly(t, c, "b", 20, 5*time.Second)
}

// With every endpoint unhealthy, calls fail with Unavailable saying why, or wait with
// WaitForReady; Dial waits for a healthy one.
func TestHealthCheckAllUnhealthy(t *testing.T) {
	leakcheck.Check(t)
	a, b := startServer(t, "a", "", true), startServer(t, "b", "", true)
	c := dial(t, a.addr+","+b.addr, rpc.WithHealthCheck(""))
	a.hs.SetServingStatus("", health.NotServing)
	b.hs.Shutdown()

	deadline := time.Now().Add(5 * time.Second)
	var err error
	for {
		if _, err = who(context.Background(), c); err != nil || time.Now().After(deadline) {
			break
		}
	}
	if !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	for _, want := range []string{"no endpoint", "healthy", a.addr, b.addr, "NOT_SERVING"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}

	// Dial waits for its whole context for a healthy endpoint; it can say NOT_SERVING only
	// if the first health status came within it, which under load takes longer than the
	// 300 ms tried first (the timing is not what is tested: the longer tries are only
	// for a loaded machine).
	for timeout := 300 * time.Millisecond; ; timeout *= 2 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err = rpc.Dial(ctx, a.addr, rpc.WithHealthCheck(""))
		cancel()
		if !errors.Is(err, rpc.ErrUnavailable) {
			t.Fatalf("Dial of an unhealthy server: %v, want Unavailable", err)
		}
		if strings.Contains(err.Error(), "NOT_SERVING") {
			break
		}
		if timeout >= 5*time.Second {
			t.Fatalf("Dial of an unhealthy server with %v: %v, want Unavailable saying NOT_SERVING", timeout, err)
		}
	}

	got := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		name, err := who(ctx, c, rpc.WaitForReady())
		if err != nil {
			name = err.Error()
		}
		got <- name
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case name := <-got:
		t.Fatalf("a WaitForReady call did not wait: %s", name)
	default:
	}
	b.hs.Resume()
	if name := <-got; name != "b" {
		t.Fatalf("the waiting call: %s, want b", name)
	}
}

// After a reconnection the client watches again, on the new connection: a new server
// on the same address that is NOT_SERVING takes no calls.
func TestHealthCheckReconnect(t *testing.T) {
	leakcheck.Check(t)
	a, b := startServer(t, "a", "", true), startServer(t, "b", "", true)
	c := dial(t, a.addr+","+b.addr, rpc.WithHealthCheck(""), rpc.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	waitBoth(t, c)
	a.srv.Stop()
	waitOnly(t, c, "b", 10, 5*time.Second)
	a2 := startServer(t, "a2", a.addr, true)
	a2.hs.SetServingStatus("", health.NotServing)
	time.Sleep(200 * time.Millisecond) // reconnected by now (backoff ≤ 50ms), and watched
	if got := spread(t, c, 50); got["a2"] != 0 {
		t.Fatalf("calls went to the new server, NOT_SERVING: %v", got)
	}
	a2.hs.SetServingStatus("", health.Serving)
	deadline := time.Now().Add(5 * time.Second)
	for spread(t, c, 20)["a2"] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no call to the new server once SERVING")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// GracefulStop waits for calls in flight: the client's watch ends when the server says
// GOAWAY, so that it does not hold the stop up.
func TestHealthCheckGracefulStop(t *testing.T) {
	leakcheck.Check(t)
	a := startServer(t, "a", "", true)
	c := dial(t, a.addr, rpc.WithHealthCheck(""))
	if _, err := who(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { a.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop held up by the client's health watch")
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
