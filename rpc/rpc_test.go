package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// A hand-written service, shaped as cmd/mwrpcgen writes them.
type Msg struct {
	Text string
	N    int64
	Blob []byte
}

type Svc interface {
	Echo(ctx context.Context, m *Msg) (*Msg, error)
	Fail(ctx context.Context, m *Msg) (*Msg, error) // fails with code m.N
	Sleep(ctx context.Context, m *Msg) (*Msg, error)
	Bytes(ctx context.Context, b []byte) ([]byte, error)
}

type svcClient struct{ cc rpc.Invoker }

func (c svcClient) call(ctx context.Context, name string, m *Msg) (*Msg, error) {
	out := new(Msg)
	if err := c.cc.Invoke(ctx, "/test.Svc/"+name, m, out); err != nil {
		return nil, err
	}
	return out, nil
}
func (c svcClient) Echo(ctx context.Context, m *Msg) (*Msg, error)  { return c.call(ctx, "Echo", m) }
func (c svcClient) Fail(ctx context.Context, m *Msg) (*Msg, error)  { return c.call(ctx, "Fail", m) }
func (c svcClient) Sleep(ctx context.Context, m *Msg) (*Msg, error) { return c.call(ctx, "Sleep", m) }
func (c svcClient) Bytes(ctx context.Context, b []byte) ([]byte, error) {
	var out []byte
	if err := c.cc.Invoke(ctx, "/test.Svc/Bytes", b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

func handler(name string, f func(Svc, context.Context, *Msg) (*Msg, error)) rpc.MethodDesc {
	return rpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, ic rpc.UnaryServerInterceptor) (any, error) {
		in := new(Msg)
		if err := dec(in); err != nil {
			return nil, err
		}
		if ic == nil {
			return f(srv.(Svc), ctx, in)
		}
		return ic(ctx, in, &rpc.UnaryServerInfo{Server: srv, FullMethod: "/test.Svc/" + name}, func(ctx context.Context, req any) (any, error) {
			return f(srv.(Svc), ctx, req.(*Msg))
		})
	}}
}

var svcDesc = rpc.ServiceDesc{
	ServiceName: "test.Svc",
	HandlerType: (*Svc)(nil),
	Methods: []rpc.MethodDesc{
		handler("Echo", Svc.Echo), handler("Fail", Svc.Fail), handler("Sleep", Svc.Sleep),
		{MethodName: "Bytes", Codec: codec.Raw{}, Handler: func(srv any, ctx context.Context, dec func(any) error, ic rpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			return srv.(Svc).Bytes(ctx, in)
		}},
	},
}

type impl struct {
	slept chan error // what Sleep's context said
}

func (s *impl) Echo(ctx context.Context, m *Msg) (*Msg, error) {
	if m.Text == "panic" {
		panic("handler panic")
	}
	if md, ok := rpc.FromIncomingContext(ctx); ok && len(md["x-echo"]) > 0 {
		rpc.SetTrailer(ctx, rpc.MD{"x-echoed": md["x-echo"]})
	}
	return m, nil
}
func (s *impl) Fail(ctx context.Context, m *Msg) (*Msg, error) {
	return nil, rpc.Errorf(rpc.Code(m.N), "failing with %d", m.N)
}
func (s *impl) Sleep(ctx context.Context, m *Msg) (*Msg, error) {
	select {
	case <-ctx.Done():
		select {
		case s.slept <- ctx.Err():
		default:
		}
		return nil, ctx.Err()
	case <-time.After(time.Duration(m.N)):
		return m, nil
	}
}
func (s *impl) Bytes(ctx context.Context, b []byte) ([]byte, error) {
	if string(b) == "slow" {
		time.Sleep(50 * time.Millisecond)
	}
	return bytes.Clone(b), nil
}

type env struct {
	srv     *rpc.Server
	client  *rpc.Client
	svc     Svc
	impl    *impl
	streams *streamsImpl // the streaming service's (stream_test.go)
	addr    string
}

// withDevices, when set (the ibverbs-tagged rpc_ibv_test.go), gives the options that put a
// server or a client on a device of its own (it opens the device and closes it at the
// test's cleanup); nil leaves them on the default soft TCP devices.
var withDevices func(t testing.TB) ([]rpc.ServerOption, []rpc.DialOption)

// listen, by default TCP on loopback, makes the listener start's server serves (at addr
// again, if not "": a restarted server). TestSHM replaces it and target.
var listen = func(addr string) (net.Listener, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	return net.Listen("tcp", addr)
}

// target is the target a client dials to reach ln.
var target = func(ln net.Listener) string { return ln.Addr().String() }

// fabricTest is one of this package's tests, by name, that a fabric suite (TestSHM,
// TestIBV) runs again with listen, target or withDevices set for its fabric.
type fabricTest struct {
	name string
	f    func(*testing.T)
}

// runFabricSuite runs, as subtests of t, the tests every fabric suite runs (calls of each
// size, deadlines, cancellation, status codes, panics, metadata, restarts, streams), then
// the suite's own extra tests.
func runFabricSuite(t *testing.T, extra ...fabricTest) {
	tests := []fabricTest{
		{"MixedSizes", TestMixedSizes},
		{"DeadlineExceeded", TestDeadlineExceeded},
		{"CancelPropagates", TestCancelPropagates},
		{"StatusCodesRoundTrip", TestStatusCodesRoundTrip},
		{"PanicIsInternal", TestPanicIsInternal},
		{"MetadataAndInterceptors", TestMetadataAndInterceptors},
		{"ServerRestart", TestServerRestart},
		{"StreamKinds", TestStreamKinds},
		{"StreamFlowControl", TestStreamFlowControl},
		{"StreamEnds", TestStreamEnds},
	}
	for _, tc := range append(tests, extra...) {
		t.Run(tc.name, tc.f)
	}
}

// deviceServerOpts returns sopts after the server-side device option, if any.
func deviceServerOpts(t testing.TB, sopts ...rpc.ServerOption) []rpc.ServerOption {
	if withDevices == nil {
		return sopts
	}
	s, _ := withDevices(t)
	return append(s, sopts...)
}

func start(t testing.TB, sopts []rpc.ServerOption, copts ...rpc.DialOption) *env {
	t.Helper()
	e := &env{impl: &impl{slept: make(chan error, 1)}, streams: &streamsImpl{ended: make(chan error, 16)}}
	e.srv, e.client, e.addr = serve(t, func(srv *rpc.Server) {
		srv.RegisterService(&svcDesc, e.impl)
		srv.RegisterService(&streamsDesc, e.streams)
	}, false, sopts, copts...)
	e.svc = svcClient{e.client}
	return e
}

// serve is how this package's tests stand up a server and a client of it (start,
// startStreams, startLend and startTelemetry build on it): a server with the services
// register adds, listening with listen (TCP on loopback, or what TestSHM sets) on the
// devices withDevices gives, if set, and a client dialed to it. At the test's cleanup the
// client closes (with checkClose, an error there, such as a pooled buffer never returned,
// fails the test), the server stops, Serve's error is checked, and no goroutine either
// started may be left.
func serve(t testing.TB, register func(*rpc.Server), checkClose bool, sopts []rpc.ServerOption, copts ...rpc.DialOption) (*rpc.Server, *rpc.Client, string) {
	t.Helper()
	if withDevices != nil { // before base: the devices outlive this cleanup's check
		s, c := withDevices(t)
		sopts, copts = append(s, sopts...), append(c, copts...)
	}
	base := runtime.NumGoroutine()
	srv := rpc.NewServer(sopts...)
	register(srv)
	ln, err := listen("")
	if err != nil {
		t.Fatal(err)
	}
	addr := target(ln)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.Dial(ctx, addr, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := client.Close(); err != nil && checkClose {
			t.Errorf("client Close: %v", err)
		}
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		leakcheck.Wait(t, base)
	})
	return srv, client, addr
}

func TestStatusCodesRoundTrip(t *testing.T) {
	e := start(t, nil)
	for c := rpc.Canceled; c <= rpc.Unauthenticated; c++ {
		_, err := e.svc.Fail(context.Background(), &Msg{N: int64(c)})
		var st *rpc.Status
		if !errors.As(err, &st) || st.Code != c || st.Message != fmt.Sprintf("failing with %d", c) {
			t.Errorf("code %v: got %v", c, err)
		}
		if !errors.Is(err, &rpc.Status{Code: c}) || rpc.CodeOf(err) != c {
			t.Errorf("code %v: errors.Is/CodeOf do not match %v", c, err)
		}
	}
	if _, err := e.svc.Fail(context.Background(), &Msg{N: int64(rpc.NotFound)}); !errors.Is(err, rpc.ErrNotFound) {
		t.Errorf("errors.Is(err, ErrNotFound) false for %v", err)
	}
}

func TestDeadlineExceeded(t *testing.T) {
	e := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := e.svc.Sleep(ctx, &Msg{N: int64(10 * time.Second)})
	if !errors.Is(err, rpc.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	select {
	case err := <-e.impl.slept:
		if err == nil {
			t.Fatal("handler context ended without an error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler never saw its context end")
	}
}

func TestCancelPropagates(t *testing.T) {
	e := start(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel)
	if _, err := e.svc.Sleep(ctx, &Msg{N: int64(10 * time.Second)}); !errors.Is(err, rpc.ErrCanceled) {
		t.Fatalf("err = %v, want Canceled", err)
	}
	select {
	case err := <-e.impl.slept:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler saw %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancellation did not reach the handler")
	}
}

func TestPanicIsInternal(t *testing.T) {
	e := start(t, nil)
	if _, err := e.svc.Echo(context.Background(), &Msg{Text: "panic"}); !errors.Is(err, rpc.ErrInternal) || !strings.Contains(err.Error(), "handler panic") {
		t.Fatalf("err = %v, want Internal naming the panic", err)
	}
	if _, err := e.svc.Echo(context.Background(), &Msg{Text: "after"}); err != nil {
		t.Fatalf("server stopped serving after a panic: %v", err)
	}
}

func TestUnknownMethod(t *testing.T) {
	e := start(t, nil)
	err := e.client.Invoke(context.Background(), "/test.Svc/Nope", &Msg{}, new(Msg))
	if !errors.Is(err, rpc.ErrUnimplemented) || !strings.Contains(err.Error(), "/test.Svc/Nope") {
		t.Fatalf("err = %v, want Unimplemented naming the method", err)
	}
}

func TestOverload(t *testing.T) {
	e := start(t, []rpc.ServerOption{rpc.WithTransport(transport.Config{Handlers: 1})})
	go e.svc.Sleep(context.Background(), &Msg{N: int64(300 * time.Millisecond)})
	time.Sleep(50 * time.Millisecond)
	if _, err := e.svc.Echo(context.Background(), &Msg{}); !errors.Is(err, rpc.ErrResourceExhausted) || !strings.Contains(err.Error(), "overloaded") {
		t.Fatalf("err = %v, want ResourceExhausted saying the server is overloaded", err)
	}
}

func TestMixedSizes(t *testing.T) {
	e := start(t, nil)
	var wg sync.WaitGroup
	for i, n := range []int{0, 10, 1000, 16 << 10, 100 << 10, 1 << 20, 4 << 20} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			blob := bytes.Repeat([]byte{byte(i)}, n)
			out, err := e.svc.Echo(context.Background(), &Msg{Text: "m", N: int64(n), Blob: blob})
			if err != nil || out.N != int64(n) || !bytes.Equal(out.Blob, blob) {
				t.Errorf("struct of %d bytes: %v", n, err)
			}
		}()
		go func() {
			defer wg.Done()
			b := bytes.Repeat([]byte{byte(i + 1)}, n)
			out, err := e.svc.Bytes(context.Background(), b)
			if err != nil || !bytes.Equal(out, b) {
				t.Errorf("[]byte of %d bytes: %v", n, err)
			}
		}()
	}
	wg.Wait()
}

func TestMetadataAndInterceptors(t *testing.T) {
	var order []string
	var mu sync.Mutex
	log := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	si := func(name string) rpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *rpc.UnaryServerInfo, h rpc.UnaryHandler) (any, error) {
			log("server " + name + " " + info.FullMethod)
			return h(ctx, req)
		}
	}
	ci := func(name string) rpc.UnaryClientInterceptor {
		return func(ctx context.Context, method string, req, reply any, inv rpc.UnaryInvoker, opts ...rpc.CallOption) error {
			log("client " + name)
			return inv(ctx, method, req, reply, opts...)
		}
	}
	e := start(t, []rpc.ServerOption{rpc.WithUnaryInterceptor(si("1")), rpc.WithUnaryInterceptor(si("2"))},
		rpc.WithClientInterceptor(ci("1")), rpc.WithClientInterceptor(ci("2")))
	ctx := rpc.NewOutgoingContext(context.Background(), rpc.Pairs("X-Echo", "hello"))
	var trailer rpc.MD
	out := new(Msg)
	if err := e.client.Invoke(ctx, "/test.Svc/Echo", &Msg{Text: "md"}, out, rpc.Trailer(&trailer)); err != nil {
		t.Fatal(err)
	}
	if got := trailer["x-echoed"]; len(got) != 1 || got[0] != "hello" {
		t.Fatalf("trailer %v, want x-echoed: hello", trailer)
	}
	want := []string{"client 1", "client 2", "server 1 /test.Svc/Echo", "server 2 /test.Svc/Echo"}
	mu.Lock() // the server side wrote it across a socket, which the race detector does not see
	defer mu.Unlock()
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("interceptors ran %v, want %v", order, want)
	}
}

func TestServerRestart(t *testing.T) {
	e := start(t, nil, rpc.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	if _, err := e.svc.Echo(context.Background(), &Msg{Text: "before"}); err != nil {
		t.Fatal(err)
	}
	e.srv.Stop()
	if _, err := e.svc.Echo(context.Background(), &Msg{Text: "down"}); !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("during the restart: %v, want Unavailable", err)
	}
	// A new server on the same address.
	srv2 := rpc.NewServer(deviceServerOpts(t)...)
	srv2.RegisterService(&svcDesc, e.impl)
	ln, err := listen(e.addr)
	if err != nil {
		t.Fatal(err)
	}
	go srv2.Serve(ln)
	defer srv2.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.svc.Echo(ctx, &Msg{Text: "after"}); err == nil {
		return // reconnected already
	}
	out := new(Msg)
	if err := e.client.Invoke(ctx, "/test.Svc/Echo", &Msg{Text: "after"}, out, rpc.WaitForReady()); err != nil || out.Text != "after" {
		t.Fatalf("after the restart: %v", err)
	}
}

func TestBalancers(t *testing.T) {
	// Three servers; the first answers 20 ms late.
	var counts [3]atomic.Int64
	var addrs []string
	for i := range counts {
		srv := rpc.NewServer(rpc.WithUnaryInterceptor(func(ctx context.Context, req any, info *rpc.UnaryServerInfo, h rpc.UnaryHandler) (any, error) {
			counts[i].Add(1)
			if i == 0 {
				time.Sleep(20 * time.Millisecond)
			}
			return h(ctx, req)
		}))
		srv.RegisterService(&svcDesc, &impl{})
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addrs = append(addrs, ln.Addr().String())
		go srv.Serve(ln)
		defer srv.Stop()
	}
	run := func(t *testing.T, b rpc.Balancer) [3]int64 {
		for i := range counts {
			counts[i].Store(0)
		}
		c, err := rpc.Dial(context.Background(), strings.Join(addrs, ","), rpc.WithBalancer(b))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		svc := svcClient{c}
		var wg sync.WaitGroup
		for g := 0; g < 6; g++ { // 6 callers, 15 calls each
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 15; i++ {
					if _, err := svc.Echo(context.Background(), &Msg{Text: "x"}); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		return [3]int64{counts[0].Load(), counts[1].Load(), counts[2].Load()}
	}
	t.Run("round robin", func(t *testing.T) {
		got := run(t, rpc.RoundRobin)
		for i, n := range got {
			if n < 20 || n > 40 {
				t.Errorf("endpoint %d served %d of 90 calls; round robin gives each about 30 (%v)", i, n, got)
			}
		}
	})
	t.Run("least outstanding", func(t *testing.T) {
		got := run(t, rpc.LeastOutstanding)
		if got[0] >= 20 || got[1]+got[2] <= 70 {
			t.Errorf("calls per endpoint %v: the slow endpoint 0 should get far fewer than a third", got)
		}
	})
}

func TestGracefulStop(t *testing.T) {
	e := start(t, nil)
	done := make(chan error, 1)
	go func() {
		_, err := e.svc.Sleep(context.Background(), &Msg{N: int64(200 * time.Millisecond)})
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	e.srv.GracefulStop()
	if err := <-done; err != nil {
		t.Fatalf("a call in flight during GracefulStop failed: %v", err)
	}
}

func TestBadOutgoingMetadata(t *testing.T) {
	e := start(t, nil)
	ctx := rpc.NewOutgoingContext(context.Background(), rpc.MD{strings.Repeat("k", 70000): {"v"}})
	if _, err := e.svc.Echo(ctx, &Msg{}); !errors.Is(err, rpc.ErrInvalidArgument) || !strings.Contains(err.Error(), "metadata key") {
		t.Fatalf("a 70000-byte metadata key: %v, want InvalidArgument naming it", err)
	}
	if _, err := e.svc.Echo(context.Background(), &Msg{Text: "still fine"}); err != nil {
		t.Fatal(err)
	}
}

// TestAdaptiveInline: a method whose runs are all short runs where its request is reaped
// (transport.Config.InlineBudget); a slow one never does; one slow run of an inline method
// sends it back to the handler pool, and while that run lasts the poller's other
// connections are served.
func TestAdaptiveInline(t *testing.T) {
	// A budget of 10 ms: short runs stay short under the race detector or a busy machine.
	e := start(t, []rpc.ServerOption{rpc.WithTransport(transport.Config{InlineBudget: 10 * time.Millisecond})})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	inline := func() uint64 { return e.srv.Stats().Inline }
	calls := func(n int, b []byte) uint64 {
		t.Helper()
		before := inline()
		for i := 0; i < n; i++ {
			if _, err := e.svc.Bytes(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		return inline() - before
	}
	if n := calls(200, []byte("fast")); n < 100 {
		t.Fatalf("%d of 200 short calls ran inline, want most after the first 64", n)
	}
	before := inline()
	for i := 0; i < 20; i++ {
		if _, err := e.svc.Sleep(ctx, &Msg{N: int64(15 * time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := inline() - before; n != 0 {
		t.Fatalf("%d calls of a 15 ms method ran inline", n)
	}
	// One slow run of the inline method: another connection is served meanwhile.
	other, err := rpc.Dial(ctx, e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	slow := make(chan error, 1)
	go func() {
		_, err := e.svc.Bytes(ctx, []byte("slow"))
		slow <- err
	}()
	time.Sleep(time.Millisecond) // the slow call is running
	t0 := time.Now()
	if _, err := (svcClient{other}).Echo(ctx, &Msg{Text: "meanwhile"}); err != nil {
		t.Fatal(err)
	}
	waited := time.Since(t0)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	if waited > 25*time.Millisecond {
		t.Fatalf("a call on another connection took %v while an inline handler slept 50ms: the poller was not lent", waited)
	}
	if n := calls(64, []byte("fast")); n != 0 {
		t.Fatalf("%d of the 64 calls after a slow run ran inline, want none", n)
	}
	if n := calls(100, []byte("fast")); n == 0 {
		t.Fatal("the method did not go back to running inline after 64 short runs")
	}
}
