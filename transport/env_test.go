package transport

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// This file is the one way this package's tests stand up a server and a client: newEnv.
// The end-to-end tests, the benchmarks and the hostile-peer suites (hostile_test.go,
// hostile_shm_linux_test.go) all start from it, so that every one of them gets the same
// teardown checks.

// fabric opens the two devices of a test: in-process or TCP (or shm, on Linux).
type fabric struct {
	name string
	open func(t testing.TB) (client, server verbs.Device)
}

// fabricListeners, by fabric name, make the listener a test's server serves and the
// address its client dials where they are not TCP's on loopback (the shm fabric's Unix
// socket).
var fabricListeners = map[string]func(t testing.TB) (net.Listener, string){}

// listenOn returns the listener a test's server serves on and the address to dial.
func (fb fabric) listenOn(t testing.TB) (net.Listener, string) {
	t.Helper()
	if listen := fabricListeners[fb.name]; listen != nil {
		return listen(t)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln, ln.Addr().String()
}

var fabrics = []fabric{
	{"inproc", func(t testing.TB) (verbs.Device, verbs.Device) {
		f := soft.NewFabric()
		a, _ := f.Open("client")
		b, _ := f.Open("server")
		return a, b
	}},
	{"tcp", func(t testing.TB) (verbs.Device, verbs.Device) {
		a, _ := soft.OpenTCP("client")
		b, _ := soft.OpenTCP("server")
		return a, b
	}},
}

// tcpFabric is the soft TCP fabric: what a peer that reaches the port over the network
// speaks, and so the fabric of the hostile-peer suite.
var tcpFabric = fabrics[1]

// fabricNamed returns the fabric of that name, or skips the test where this build has
// none (shm is Linux's, ibv needs the ibverbs tag and a device).
func fabricNamed(t testing.TB, name string) fabric {
	t.Helper()
	for _, fb := range fabrics {
		if fb.name == name {
			return fb
		}
	}
	t.Skipf("SKIPPED: no %s fabric in this build (%s/%s)", name, runtime.GOOS, runtime.GOARCH)
	return fabric{}
}

// env is a client connected to a server, torn down at cleanup with the checks every test
// gets: no window left bound, every pool buffer returned, no goroutine left behind.
type env struct {
	client, server *Transport
	conn           *Conn
	addr           string // where the server listens
	cdev, sdev     verbs.Device
	// allowRNR: more SENDs in flight than posted receives is the test's point (shared
	// receives overcommitted, or a hostile peer that ignores credits), so receiver-not-ready
	// NAKs are not a transport bug.
	allowRNR bool
}

// envOption changes what newEnv stands up, for the tests whose client is not configured
// like their server.
type envOption func(*envConfig)

type envConfig struct {
	client Config
}

// withClient gives the client a configuration of its own (the server keeps newEnv's cfg):
// the hostile suites' server has tight limits their good client must not share.
func withClient(cfg Config) envOption {
	return func(c *envConfig) { c.client = cfg }
}

// newEnv stands up a server of h over fb with cfg, and a client (with cfg too, unless
// withClient says otherwise) connected to it. At cleanup it checks that no window is left
// bound, that the transports close cleanly, that neither device sent receiver-not-ready
// NAKs (unless allowRNR), and that no goroutine is left behind.
func newEnv(t testing.TB, fb fabric, h Handler, cfg Config, opts ...envOption) *env {
	t.Helper()
	ec := envConfig{client: cfg}
	for _, o := range opts {
		o(&ec)
	}
	base := runtime.NumGoroutine()
	cdev, sdev := fb.open(t)
	e := &env{cdev: cdev, sdev: sdev}

	var err error
	if e.server, err = New(sdev, h, cfg); err != nil {
		t.Fatal(err)
	}
	if e.client, err = New(cdev, nil, ec.client); err != nil {
		t.Fatal(err)
	}
	ln, addr := fb.listenOn(t)
	served := make(chan error, 1)
	go func() { served <- e.server.Serve(ln) }()
	e.addr = addr
	t.Cleanup(func() { e.close(t, ln, served, base) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if e.conn, err = e.client.Dial(ctx, e.addr); err != nil {
		t.Fatal(err)
	}
	return e
}

// close tears e down with its checks (newEnv's cleanup).
func (e *env) close(t testing.TB, ln net.Listener, served <-chan error, base int) {
	e.checkWindows(t)
	ln.Close()
	if err := e.client.Close(); err != nil {
		t.Errorf("client close: %v", err)
	}
	if err := e.server.Close(); err != nil {
		t.Errorf("server close: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
	for _, d := range []verbs.Device{e.cdev, e.sdev} {
		// Credits keep a receive posted for every SEND the transport makes.
		if sd, ok := d.(*soft.Device); ok && sd.Stats().RNRNaks > 0 && !e.allowRNR {
			t.Errorf("%s sent %d receiver-not-ready NAKs: a SEND found no receive posted", d.Name(), sd.Stats().RNRNaks)
		}
		if err := d.Close(); err != nil {
			t.Errorf("device close: %v", err)
		}
	}
	leakcheck.Wait(t, base)
}

// describe says what each side knows, for a test that found a call or stream stalled:
// the client's connection's error and calls in flight, the server's requests served and
// its connections' errors, and both devices' counters (where they are soft devices), so that a stall reads as one
// side's queue pair failing, a failure the other side saw, or neither.
func (e *env) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "client conn: err %v, %d in flight; server: %d requests served, conns:", e.conn.Err(), e.conn.InFlight(), e.server.Stats().Served)
	e.server.mu.Lock()
	for c := range e.server.conns {
		fmt.Fprintf(&b, " [err %v]", c.Err())
	}
	e.server.mu.Unlock()
	for _, d := range []verbs.Device{e.cdev, e.sdev} {
		if sd, ok := d.(*soft.Device); ok {
			fmt.Fprintf(&b, "; %s: %+v", d.Name(), sd.Stats())
		}
	}
	return b.String()
}

// stallSnapshot is what a test that may stall takes while it waits: describe and every
// goroutine's stack, after a delay. A stall over the soft NIC ends in the queue pairs'
// retry limit (8 s), which tears down the state that says where it stuck; a snapshot
// taken before that, printed if the test then fails, still has it.
type stallSnapshot struct {
	timer *time.Timer
	done  chan struct{}
	text  string
}

// snapshotAfter takes a stallSnapshot of e after d; stop it before reading it.
func (e *env) snapshotAfter(d time.Duration) *stallSnapshot {
	s := &stallSnapshot{done: make(chan struct{})}
	s.timer = time.AfterFunc(d, func() {
		defer close(s.done)
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		s.text = fmt.Sprintf("at %v: %s\n%s", d, e.describe(), b.String())
	})
	return s
}

// stop ends the snapshot's wait, or waits for the snapshot in progress, and returns what
// it took ("" when it was not taken).
func (s *stallSnapshot) stop() string {
	if s.timer.Stop() {
		return ""
	}
	<-s.done
	return s.text
}

// doneWhileLocked runs f on another goroutine while mu is held, and fails the test, naming
// what f does, unless f returns within 5 s: f must not need mu. A failure lets go of mu
// first, so that f and the test's cleanup finish rather than hang.
func doneWhileLocked(t *testing.T, mu *sync.Mutex, what string, f func()) {
	t.Helper()
	mu.Lock()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
		mu.Unlock()
	case <-time.After(5 * time.Second):
		mu.Unlock()
		<-done
		t.Fatalf("%s waited for a lock it must not take", what)
	}
}

// serverConn returns the server's side of the connection.
func (e *env) serverConn(t testing.TB) *Conn {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		e.server.mu.Lock()
		for c := range e.server.conns {
			e.server.mu.Unlock()
			return c
		}
		e.server.mu.Unlock()
	}
	// What the client's side knows helps tell a setup that never ended from a connection
	// that was torn down again.
	t.Fatalf("the server has no connection after 5s (%s)", e.describe())
	return nil
}

// checkWindows fails if a window of either side is still bound once calls are done.
func (e *env) checkWindows(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		bound := 0
		for _, tr := range []*Transport{e.client, e.server} {
			tr.mu.Lock()
			for c := range tr.conns {
				st := c.win.ws.Stats()
				bound += st.Bound + st.Invalidating + st.Reserved
				c.mu.Lock()
				if c.grant.out != 0 { // a grant lives until used, its lease or teardown (pushed.go)
					bound--
				}
				c.mu.Unlock()
			}
			tr.mu.Unlock()
		}
		if bound == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d windows still bound after the calls returned", bound)
			return
		}
		time.Sleep(time.Millisecond)
	}
}
