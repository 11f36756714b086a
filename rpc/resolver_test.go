package rpc_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/internal/loopback"
	"github.com/mwrpc/mwrpc/rpc"
)

// backend is a server of the test service that counts the calls it is given.
type backend struct {
	addr  string
	srv   *rpc.Server
	calls atomic.Int64
	stop  func() // stops the server (also at the test's cleanup)
}

// listenBackend starts a backend on addr, or says why it cannot listen there.
func listenBackend(t *testing.T, addr string) (*backend, error) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &backend{addr: ln.Addr().String()}
	b.srv = rpc.NewServer(rpc.WithUnaryInterceptor(func(ctx context.Context, req any, info *rpc.UnaryServerInfo, h rpc.UnaryHandler) (any, error) {
		b.calls.Add(1)
		return h(ctx, req)
	}))
	b.srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
	done := make(chan struct{})
	go func() { defer close(done); _ = b.srv.Serve(ln) }()
	b.stop = sync.OnceFunc(func() { b.srv.Stop(); <-done })
	t.Cleanup(b.stop)
	return b, nil
}

func startBackend(t *testing.T) *backend {
	t.Helper()
	b, err := listenBackend(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// backendPair starts two backends on one port, on 127.0.0.1 and 127.0.0.2, as two hosts of
// one name would be: an A record's answer changes the IP only.
func backendPair(t *testing.T) (a, b *backend, port string) {
	t.Helper()
	loopback.Require(t, "127.0.0.2")
	for range 10 {
		a = startBackend(t)
		_, port, _ = net.SplitHostPort(a.addr)
		var err error
		if b, err = listenBackend(t, "127.0.0.2:"+port); err == nil {
			return a, b, port
		}
		a.stop() // the port is taken on 127.0.0.2: another
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	return nil, nil, ""
}

// fakeLookup is a DNS of the test's: names to IPs, which the test changes.
type fakeLookup struct {
	mu      sync.Mutex
	hosts   map[string][]string
	err     error // what every lookup fails with, if set
	lookups atomic.Int64
	// onLookup, if set before the client starts, is told each lookup's number as it begins.
	onLookup func(n int64)
}

func newFakeLookup() *fakeLookup { return &fakeLookup{hosts: map[string][]string{}} }

func (f *fakeLookup) set(host string, ips ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hosts[host] = ips
}

func (f *fakeLookup) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeLookup) LookupHost(ctx context.Context, host string) ([]string, error) {
	if n := f.lookups.Add(1); f.onLookup != nil {
		f.onLookup(n)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	ips, ok := f.hosts[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(ips), nil
}

func (f *fakeLookup) LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error) {
	return "", nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

// echo makes one call, which must succeed.
func echo(t *testing.T, c *rpc.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := (svcClient{c}).Echo(ctx, &Msg{Text: "x"}); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond for up to 5 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s, still not %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// follow checks that calls of c move from one backend to another once change has changed
// the answer: they land on to, and then no more on from, whose connection closes.
func follow(t *testing.T, c *rpc.Client, from, to *backend, change func()) {
	t.Helper()
	echo(t, c)
	if from.calls.Load() == 0 || to.calls.Load() != 0 {
		t.Fatalf("before the change: %d calls on the old backend, %d on the new; want them all on the old", from.calls.Load(), to.calls.Load())
	}
	change()
	waitFor(t, "calling the new backend", func() bool { echo(t, c); return to.calls.Load() > 0 })
	waitFor(t, "closing the old backend's connection", func() bool { return from.srv.Stats().Conns == 0 })
	before := from.calls.Load()
	for range 10 {
		echo(t, c)
	}
	if n := from.calls.Load() - before; n != 0 {
		t.Fatalf("%d calls went to the old backend after it left the answer", n)
	}
}

// TestResolverFollowsDNS: a client of dns:///name:port follows the name's answer (a fake
// lookup's) from one host to another: calls land on the new one; the old endpoint is
// dropped, its call in flight finishes, and then its connection closes.
func TestResolverFollowsDNS(t *testing.T) {
	leakcheck.Check(t)
	a, b, port := backendPair(t)
	dns := newFakeLookup()
	dns.set("kv.test", "127.0.0.1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, "dns:///kv.test:"+port, rpc.WithDNSLookup(dns), rpc.WithResolveInterval(20*time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c)

	// A call in flight on the old host when the answer changes.
	slept := make(chan error, 1)
	go func() {
		_, err := (svcClient{c}).Sleep(context.Background(), &Msg{N: int64(500 * time.Millisecond)})
		slept <- err
	}()
	waitFor(t, "sleeping on the old host", func() bool { return a.calls.Load() == 2 })

	dns.set("kv.test", "127.0.0.2")
	waitFor(t, "calling the new host", func() bool { echo(t, c); return b.calls.Load() > 0 })
	select {
	case err := <-slept:
		t.Fatalf("the call in flight ended (%v) before it was done", err)
	default:
		if a.srv.Stats().Conns != 1 {
			t.Fatal("the old host's connection closed while a call was in flight on it")
		}
	}
	if err := <-slept; err != nil {
		t.Fatalf("the call in flight on the removed endpoint: %v", err)
	}
	waitFor(t, "closing the old host's connection", func() bool { return a.srv.Stats().Conns == 0 && c.Stats().Conns == 1 })
	before := a.calls.Load()
	for range 10 {
		echo(t, c)
	}
	if a.calls.Load() != before {
		t.Fatal("calls went to the old host after it left the answer")
	}
}

// dnsServer is a DNS server on 127.0.0.1 UDP, answering A, AAAA and SRV questions from
// records the test sets: enough for Go's own resolver.
type dnsServer struct {
	addr    string
	mu      sync.Mutex
	hosts   map[string][]netip.Addr
	srv     map[string][]net.SRV
	queries atomic.Int64
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{addr: pc.LocalAddr().String(), hosts: map[string][]netip.Addr{}, srv: map[string][]net.SRV{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := s.answer(buf[:n]); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return s
}

func (s *dnsServer) setHost(name string, ips ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hosts[name] = nil
	for _, ip := range ips {
		s.hosts[name] = append(s.hosts[name], netip.MustParseAddr(ip))
	}
}

func (s *dnsServer) setSRV(name string, recs ...net.SRV) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv[name] = recs
}

// resolver is a Go resolver that asks this server.
func (s *dnsServer) resolver() *net.Resolver {
	var d net.Dialer
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "udp", s.addr)
	}}
}

const (
	typeA    = 1
	typeAAAA = 28
	typeSRV  = 33
)

// answer returns the response to the query q, nil if q is not one.
func (s *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 || q[2]&0x80 != 0 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for {
		if i >= len(q) {
			return nil
		}
		n := int(q[i])
		i++
		if n == 0 {
			break
		}
		if n&0xc0 != 0 || i+n > len(q) {
			return nil
		}
		labels = append(labels, strings.ToLower(string(q[i:i+n])))
		i += n
	}
	if i+4 > len(q) {
		return nil
	}
	name, qtype, qend := strings.Join(labels, "."), binary.BigEndian.Uint16(q[i:]), i+4
	s.queries.Add(1)

	s.mu.Lock()
	ips, isHost := s.hosts[name]
	srvs, isSRV := s.srv[name]
	s.mu.Unlock()
	var rrs [][]byte // type and rdata of each answer
	switch qtype {
	case typeA, typeAAAA:
		for _, ip := range ips {
			if ip.Is4() == (qtype == typeA) {
				rrs = append(rrs, binary.BigEndian.AppendUint16(nil, qtype), ip.AsSlice())
			}
		}
	case typeSRV:
		for _, r := range srvs {
			rd := binary.BigEndian.AppendUint16(nil, r.Priority)
			rd = binary.BigEndian.AppendUint16(rd, r.Weight)
			rd = binary.BigEndian.AppendUint16(rd, r.Port)
			for _, l := range strings.Split(strings.TrimSuffix(r.Target, "."), ".") {
				rd = append(append(rd, byte(len(l))), l...)
			}
			rrs = append(rrs, binary.BigEndian.AppendUint16(nil, typeSRV), append(rd, 0))
		}
	}
	var rcode uint16
	if !isHost && !isSRV {
		rcode = 3 // NXDOMAIN
	}
	flags := 0x8000 | 0x0400 | 0x0080 | binary.BigEndian.Uint16(q[2:])&0x0100 | rcode // QR, AA, RA, RD as asked
	resp := append([]byte{}, q[0], q[1])
	resp = binary.BigEndian.AppendUint16(resp, flags)
	resp = binary.BigEndian.AppendUint16(resp, 1)
	resp = binary.BigEndian.AppendUint16(resp, uint16(len(rrs)/2))
	resp = append(resp, 0, 0, 0, 0)
	resp = append(resp, q[12:qend]...)
	for j := 0; j < len(rrs); j += 2 {
		resp = append(resp, 0xc0, 12) // the question's name
		resp = append(resp, rrs[j]...)
		resp = append(resp, 0, 1, 0, 0, 0, 0) // class IN, TTL 0
		resp = binary.BigEndian.AppendUint16(resp, uint16(len(rrs[j+1])))
		resp = append(resp, rrs[j+1]...)
	}
	return resp
}

// TestDNSResolver: DNSResolver through Go's resolver and a DNS server: A and AAAA records,
// SRV records (each target's addresses with its port), an IP, a name that does not exist.
func TestDNSResolver(t *testing.T) {
	leakcheck.Check(t)
	dns := startDNS(t)
	dns.setHost("kv.test", "127.0.0.1", "127.0.0.2", "::1")
	dns.setHost("a.kv.test", "127.0.0.1")
	dns.setHost("b.kv.test", "127.0.0.2", "127.0.0.3")
	dns.setSRV("_kv._tcp.kv.test", net.SRV{Target: "a.kv.test.", Port: 7001, Priority: 1}, net.SRV{Target: "b.kv.test.", Port: 7002, Priority: 2})
	dns.setSRV("_gone._tcp.kv.test", net.SRV{Target: "gone.kv.test.", Port: 7003})
	for _, tc := range []struct {
		name    string
		want    []string
		wantErr string
	}{
		{"kv.test:7000", []string{"127.0.0.1:7000", "127.0.0.2:7000", "[::1]:7000"}, ""},
		{"_kv._tcp.kv.test", []string{"127.0.0.1:7001", "127.0.0.2:7002", "127.0.0.3:7002"}, ""},
		{"127.0.0.9:7000", []string{"127.0.0.9:7000"}, ""},
		{"nohost.test:7000", nil, "no such host"},
		{"_nosrv._tcp.kv.test", nil, "resolving the SRV records of _nosrv._tcp.kv.test"},
		{"_gone._tcp.kv.test", nil, "resolving gone.kv.test (SRV target of _gone._tcp.kv.test)"},
	} {
		r, err := rpc.DNSResolver(tc.name, dns.resolver())
		if err != nil {
			t.Fatalf("DNSResolver(%q): %v", tc.name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := r.Resolve(ctx)
		cancel()
		slices.Sort(got)
		switch {
		case tc.wantErr != "":
			var dnsErr *net.DNSError
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &dnsErr) {
				t.Errorf("%s: %v, %v; want an error saying %q that wraps a *net.DNSError", tc.name, got, err, tc.wantErr)
			}
		case err != nil || !slices.Equal(got, tc.want):
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if dns.queries.Load() == 0 {
		t.Fatal("the DNS server was never asked")
	}
}

// TestResolverDNSServer: a client follows a change of answer of a DNS server: A records
// through WithDNSLookup and a Go resolver, SRV records through a target that names the
// server (dns://server/name).
func TestResolverDNSServer(t *testing.T) {
	t.Run("A", func(t *testing.T) {
		leakcheck.Check(t)
		dns := startDNS(t)
		a, b, port := backendPair(t)
		dns.setHost("kv.test", "127.0.0.1")
		c := dialOK(t, "dns:///kv.test:"+port, rpc.WithDNSLookup(dns.resolver()))
		follow(t, c, a, b, func() { dns.setHost("kv.test", "127.0.0.2") })
	})
	t.Run("SRV", func(t *testing.T) {
		leakcheck.Check(t)
		dns := startDNS(t)
		a, b := startBackend(t), startBackend(t)
		srvOf := func(host string, b *backend) net.SRV {
			_, p, _ := net.SplitHostPort(b.addr)
			var port uint16
			fmt.Sscan(p, &port)
			return net.SRV{Target: host, Port: port}
		}
		dns.setHost("a.kv.test", "127.0.0.1")
		dns.setHost("b.kv.test", "127.0.0.1")
		dns.setSRV("_kv._tcp.kv.test", srvOf("a.kv.test.", a))
		c := dialOK(t, "dns://"+dns.addr+"/_kv._tcp.kv.test")
		follow(t, c, a, b, func() { dns.setSRV("_kv._tcp.kv.test", srvOf("b.kv.test.", b)) })
	})
}

// dialOK dials target with a short resolve interval; the client closes at the test's end.
func dialOK(t *testing.T, target string, opts ...rpc.DialOption) *rpc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts = append([]rpc.DialOption{rpc.WithResolveInterval(20*time.Millisecond, 10*time.Millisecond)}, opts...)
	c, err := rpc.Dial(ctx, target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestReresolveOnFailure: when a server goes away, the client asks its resolver again long
// before the interval, and follows the new answer; while dials keep failing it asks no more
// than once per the minimum interval.
func TestReresolveOnFailure(t *testing.T) {
	leakcheck.Check(t)
	a, b, port := backendPair(t)
	dns := newFakeLookup()
	dns.set("kv.test", "127.0.0.1")
	const minInterval = 200 * time.Millisecond
	c := dialOK(t, "dns:///kv.test:"+port, rpc.WithDNSLookup(dns), rpc.WithResolveInterval(time.Hour, minInterval),
		rpc.WithBackoff(5*time.Millisecond, 10*time.Millisecond))
	echo(t, c)
	time.Sleep(minInterval) // the first resolution is no longer recent
	n := dns.lookups.Load()
	a.stop()
	waitFor(t, "resolving again", func() bool { return dns.lookups.Load() > n })

	// Dials to the stopped server fail every few milliseconds: resolutions stay rate-limited.
	n = dns.lookups.Load()
	time.Sleep(5 * minInterval)
	if got := dns.lookups.Load() - n; got < 2 || got > 6 {
		t.Errorf("%d resolutions in %v of failing dials; want about one per %v", got, 5*minInterval, minInterval)
	}

	dns.set("kv.test", "127.0.0.2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Invoke(ctx, "/test.Svc/Echo", &Msg{}, new(Msg), rpc.WaitForReady()); err != nil || b.calls.Load() != 1 {
		t.Fatalf("a call after the answer changed to the server that is up: %v (%d calls there)", err, b.calls.Load())
	}
}

// TestResolverKeepsAddresses: an answer with no address, or an error, keeps the client's
// endpoints; the client logs it.
func TestResolverKeepsAddresses(t *testing.T) {
	leakcheck.Check(t)
	a := startBackend(t)
	host, port, _ := net.SplitHostPort(a.addr)
	dns := newFakeLookup()
	dns.set("kv.test", host)
	var log syncBuffer
	c := dialOK(t, "dns:///kv.test:"+port, rpc.WithDNSLookup(dns), rpc.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	for _, tc := range []struct {
		name, logged string
		change       func()
	}{
		{"no address", "no address", func() { dns.set("kv.test") }},
		{"an error", "SERVFAIL of the test", func() { dns.fail(errors.New("SERVFAIL of the test")) }},
	} {
		tc.change()
		n := dns.lookups.Load()
		waitFor(t, "resolving again", func() bool { return dns.lookups.Load() > n+1 })
		echo(t, c)
		if !strings.Contains(log.String(), tc.logged) || !strings.Contains(log.String(), "dns:///kv.test:"+port) {
			t.Errorf("%s: the log does not say %q and the target:\n%s", tc.name, tc.logged, log.String())
		}
	}
	if a.calls.Load() != 2 {
		t.Fatalf("%d calls reached the server; want 2", a.calls.Load())
	}
}

// resolverFunc is a Resolver of the test's.
type resolverFunc func(ctx context.Context) ([]string, error)

func (f resolverFunc) Resolve(ctx context.Context) ([]string, error) { return f(ctx) }

// TestWithResolver: a resolver of one's own replaces the target's (which is then only a
// name); an address it gives that cannot be dialed is left out, and the others are used.
func TestWithResolver(t *testing.T) {
	leakcheck.Check(t)
	a, b := startBackend(t), startBackend(t)
	t.Run("static", func(t *testing.T) {
		c := dialOK(t, "my service", rpc.WithResolver(rpc.StaticResolver(a.addr)))
		echo(t, c)
		if a.calls.Load() != 1 {
			t.Fatal("the call did not reach the resolver's address")
		}
	})
	t.Run("own", func(t *testing.T) {
		var answer atomic.Pointer[[]string]
		answer.Store(&[]string{"no port", a.addr})
		c := dialOK(t, "dns:///ignored", rpc.WithResolver(resolverFunc(func(context.Context) ([]string, error) { return *answer.Load(), nil })))
		follow(t, c, a, b, func() { answer.Store(&[]string{b.addr}) })
	})
}

// TestDialResolution: Dial retries a name that does not resolve until its context ends, and
// then says that resolution failed and why; a name that resolves meanwhile is dialed.
func TestDialResolution(t *testing.T) {
	leakcheck.Check(t)
	opts := func(dns rpc.DNSLookup) []rpc.DialOption {
		return []rpc.DialOption{rpc.WithDNSLookup(dns), rpc.WithBackoff(10*time.Millisecond, 50*time.Millisecond)}
	}
	t.Run("fails", func(t *testing.T) {
		// The context ends at the third lookup, not at a fixed time: on a loaded machine a
		// deadline could pass before the first lookup's answer was recorded.
		dns := newFakeLookup()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		dns.onLookup = func(n int64) {
			if n == 3 {
				cancel()
			}
		}
		_, err := rpc.Dial(ctx, "dns:///kv.test:7000", opts(dns)...)
		if ctx.Err() == nil {
			t.Fatalf("Dial gave up after %d lookups, before its context ended: %v; want retries until its context ends", dns.lookups.Load(), err)
		}
		var dnsErr *net.DNSError
		if !errors.Is(err, rpc.ErrUnavailable) || !errors.As(err, &dnsErr) || !strings.Contains(err.Error(), "resolving dns:///kv.test:7000") ||
			!strings.Contains(err.Error(), "no such host") || !strings.Contains(err.Error(), context.Canceled.Error()) {
			t.Fatalf("Dial of a name that does not resolve: %v; want Unavailable saying resolving failed, and why", err)
		}
	})
	t.Run("retried", func(t *testing.T) {
		a := startBackend(t)
		host, port, _ := net.SplitHostPort(a.addr)
		dns := newFakeLookup()
		time.AfterFunc(100*time.Millisecond, func() { dns.set("kv.test", host) })
		c := dialOK(t, "dns:///kv.test:"+port, opts(dns)...)
		echo(t, c)
	})
	t.Run("a call while nothing resolves", func(t *testing.T) {
		dns := newFakeLookup()
		c, err := rpc.NewClient("dns:///kv.test:7000", opts(dns)...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Until the first answer is recorded the call fails saying the first connection is
		// being set up (the lookup has begun, but the client may not have its error yet:
		// under load a call slipped in between); from then on it says why.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			err = c.Invoke(context.Background(), "/test.Svc/Echo", &Msg{}, new(Msg))
			if !errors.Is(err, rpc.ErrUnavailable) {
				t.Fatalf("a call with no address: %v; want Unavailable", err)
			}
			if strings.Contains(err.Error(), "no such host") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a call with no address, 5 s after the first lookup: %v; want Unavailable saying why", err)
			}
		}
	})
}

// TestBadTargets: a target that cannot be read is InvalidArgument, at once, naming what is
// wrong.
func TestBadTargets(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"dns:///", "names no host"},
		{"dns://kv.test:7000", "names no host"},
		{"dns:///kv.test", "missing port"},
		{"dns:///:7000", "no host"},
		{"dns:///kv.test:http2x", "bad port"},
		{"dns:///_kv._tcp", "want _service._proto.domain"},
		{"dns://no such server/kv.test:7000", "DNS server"},
		{"dns://127.0.0.1:notaport/kv.test:7000", "bad port"},
		{"foo:///x", `unknown scheme "foo"`},
		{"static://h/127.0.0.1:1", "no authority"},
		{"static:///", "names no address"},
		{"static:///127.0.0.1:1,nohost", `address "nohost"`},
	} {
		t0 := time.Now()
		c, err := rpc.NewClient(tc.target)
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, rpc.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.target) {
			t.Errorf("NewClient(%q): %v; want InvalidArgument naming the target and saying %q", tc.target, err, tc.want)
		}
		if time.Since(t0) > time.Second {
			t.Errorf("NewClient(%q) took %v", tc.target, time.Since(t0))
		}
	}
}
