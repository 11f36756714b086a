package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/ants/v2"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/credentials"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// Transport is one side's view of a device: its protection domain, registered buffer pool,
// pollers and handler pool, shared by every connection it makes or accepts.
type Transport struct {
	cfg     Config
	dev     verbs.Device
	pd      verbs.PD
	pool    *pool.Pool
	pollers []*poller
	workers *ants.PoolWithFunc
	handler Handler
	advisor InlineAdvisor // the handler's, if it is one and Config.InlineBudget allows
	// writable: large requests grant the server REMOTE_WRITE on their window
	// (wire.FlagWritable), so that the response can be written there: on a device where a
	// READ costs a round trip through the peer's CPU (a verbs.DeviceAttr.ReadCrossover).
	writable bool
	// grantBudget is what is left of Config.GrantBytes: the bytes of the grants given to
	// callers are taken from it until the grant ends (pushed.go).
	grantBudget atomic.Int64
	grants      atomic.Int64 // grants given and not yet ended: windows bound for the peer's WRITE
	cqLimit     int          // the most entries a poller's CQ grows to: the device's MaxCQE, or 0 where CQs cannot grow

	// Test hooks: every large message header received, and every completion polled.
	testHookLarge atomic.Pointer[func(*wire.Header)]
	testHookWC    atomic.Pointer[func(*verbs.WorkCompletion)]
	// testHoldResponses: responses stay in their receive slots however many callers
	// hold (a peer that stops returning credits; see Conn.leaveSlot).
	testHoldResponses atomic.Bool
	// testHookBeforeRelease runs before a caller queues the revocation of a response window.
	testHookBeforeRelease atomic.Pointer[func(*Conn)]
	// testHookPushUnwritten: a written request is announced without its WRITE (a hostile
	// caller's lie).
	testHookPushUnwritten atomic.Bool

	counters counters
	events   eventLog
	tick     time.Duration // how often an idle poller reaps leases and idle connections
	nextConn atomic.Uint32
	mu       sync.Mutex
	conns    map[*Conn]struct{}
	setup    map[net.Conn]struct{} // streams of connections being set up
	open     int                   // connections admitted: set up, or being set up
	hosts    map[string]*hostState // of those, the ones Serve accepted, by peer IP
	sweepAt  int                   // len(hosts) at which admit sweeps out the idle ones
	seeing   chan struct{}         // bounds the goroutines seeing refused connections out
	setupWG  sync.WaitGroup
	closed   bool
	wg       sync.WaitGroup // pollers and watchPeer
	running  counter        // handlers
}

// counter counts running handlers and lets Close and WaitIdle wait for none (a WaitGroup
// may not be waited on while others Add from zero). Every call of every connection counts
// itself in and out, in the stripe of its connection (Conn.stripe), so that the calls of
// connections on different cores do not all write one cache line; the lock is taken only
// once someone has waited and a stripe reaches zero, and then all of them are summed.
type counter struct {
	n       [hotStripes]paddedCount
	waiting atomic.Bool // a wait has begun: Add to zero closes idle
	mu      sync.Mutex
	idle    chan struct{} // mu
}

type paddedCount struct {
	v atomic.Int64
	_ [cacheLine - 8]byte
}

// Add adds d to stripe i's count. A call counts itself out in the stripe it counted
// itself in: no stripe goes below zero, so all are zero only when no handler runs.
func (c *counter) Add(i uint32, d int) {
	if c.n[i].v.Add(int64(d)) != 0 || !c.waiting.Load() {
		return
	}
	c.mu.Lock()
	if c.none() && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
	c.mu.Unlock()
}

// Done counts a handler of stripe i out.
func (c *counter) Done(i uint32) { c.Add(i, -1) }

// count returns how many handlers run.
func (c *counter) count() (n int) {
	for i := range c.n {
		n += int(c.n[i].v.Load())
	}
	return n
}

// none reports whether no handler runs.
func (c *counter) none() bool { return c.count() == 0 }

// wait returns when no handler runs, or ctx ends.
func (c *counter) wait(ctx context.Context) error {
	c.mu.Lock()
	c.waiting.Store(true) // before the load: an Add to zero after it sees waiting
	if c.none() {
		c.mu.Unlock()
		return nil
	}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	ch := c.idle
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Handler serves requests. Serve runs on the transport's handler pool; req aliases
// registered memory and is valid until Serve returns, unless a response written from it
// took it (ResponseWriter.Write says when).
type Handler interface {
	Serve(ctx context.Context, req []byte, w *ResponseWriter)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req []byte, w *ResponseWriter)

// Serve calls f.
func (f HandlerFunc) Serve(ctx context.Context, req []byte, w *ResponseWriter) { f(ctx, req, w) }

// New creates a transport on dev. Requests arriving on any of its connections go to h,
// which may be nil for a transport that only calls (requests are then answered with
// StatusUnimplemented). The device stays the caller's: close the transport first.
func New(dev verbs.Device, h Handler, cfg Config) (*Transport, error) {
	attr := dev.Attr()
	cfg, err := cfg.withDefaults(attr)
	if err != nil {
		return nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("mwrpc: %w", err)
	}
	if cfg.Pool.Access == 0 {
		cfg.Pool.Access = verbs.AccessLocalWrite | verbs.AccessMWBind
	}
	if len(cfg.Pool.Classes) == 0 { // powers of two up to the largest message
		for s := 256; s < 2*cfg.MaxMessage && s <= 1<<30; s <<= 1 {
			cfg.Pool.Classes = append(cfg.Pool.Classes, s)
		}
		// And the slot size, the most common buffer of all: a 66 KiB slot would take a
		// 128 KiB buffer of the next power of two.
		if i, found := slices.BinarySearch(cfg.Pool.Classes, cfg.SlotSize); !found {
			cfg.Pool.Classes = slices.Insert(cfg.Pool.Classes, i, cfg.SlotSize)
		}
	}
	if cfg.Pool.MaxBytes == 0 {
		cfg.Pool.MaxBytes = max(pool.DefaultMaxBytes, 8*int64(cfg.MaxMessage))
	}
	if p, ok := dev.(verbs.MemoryPinner); ok && !p.PinsMemory() && cfg.Pool.Memlock == pool.MemlockAuto {
		// Nothing is pinned, so RLIMIT_MEMLOCK does not apply (an unprivileged user's 8 MiB
		// would otherwise refuse the example's 1 MiB values).
		cfg.Pool.Memlock = pool.MemlockIgnore
	}
	if p, ok := dev.(verbs.BusyPoller); ok {
		p.SetBusyPoll(cfg.BusyPoll)
	}
	bp, err := pool.New(pd, cfg.Pool)
	if err != nil {
		_ = pd.Dealloc()
		return nil, fmt.Errorf("mwrpc: %w", err)
	}
	advisor, _ := h.(InlineAdvisor)
	if cfg.InlineBudget < 0 {
		advisor = nil
	}
	t := &Transport{cfg: cfg, dev: dev, pd: pd, pool: bp, handler: h, advisor: advisor, writable: attr.ReadCrossover > 0, conns: make(map[*Conn]struct{}), setup: make(map[net.Conn]struct{}),
		hosts: make(map[string]*hostState), sweepAt: 1024, seeing: make(chan struct{}, 64)}
	t.events.logger = cfg.Logger
	t.grantBudget.Store(max(cfg.GrantBytes, 0))
	t.tick = cfg.Lease / 4
	if cfg.IdleTimeout > 0 {
		t.tick = max(min(t.tick, cfg.IdleTimeout/4), time.Millisecond)
	}
	for _, d := range []time.Duration{cfg.Keepalive.MaxConnectionAge, cfg.Keepalive.MaxConnectionAgeGrace} {
		if d > 0 { // the age is told within a quarter of it
			t.tick = max(min(t.tick, d/4), time.Millisecond)
		}
	}
	t.workers, err = ants.NewPoolWithFunc(cfg.Handlers, runServerCall, ants.WithNonblocking(true))
	if err != nil {
		_ = bp.Close()
		_ = pd.Dealloc()
		return nil, fmt.Errorf("mwrpc: handler pool: %w", err)
	}
	for i := 0; i < cfg.Pollers; i++ {
		p, err := newPoller(t, i)
		if err != nil {
			t.closeResources()
			return nil, err
		}
		t.pollers = append(t.pollers, p)
		t.wg.Add(1)
		go p.run()
	}
	if _, ok := t.pollers[0].cq.(verbs.CQResizer); ok {
		t.cqLimit = dev.Attr().MaxCQE
	}
	t.cfg.MaxConns = t.defaultMaxConns()
	if t.cfg.MaxConnsPerHost == 0 {
		t.cfg.MaxConnsPerHost = max(t.cfg.MaxConns/4, 1)
	}
	return t, nil
}

// defaultMaxConns is Config.MaxConns, or when that is zero DefaultMaxConns where the
// pollers' completion queues can grow to hold that many connections and every connection
// takes its receives from a shared queue (an idle one is cheap); otherwise what the
// queues hold now, at the most a connection commits.
func (t *Transport) defaultMaxConns() int {
	if t.cfg.MaxConns > 0 {
		return t.cfg.MaxConns
	}
	_, _, sendWR, recvWR := queueSizes(&t.cfg, wire.Hello{Credits: uint32(t.cfg.Credits)})
	need := sendWR + recvWR
	held, grown := 0, 0
	for _, p := range t.pollers {
		held += (p.cq.Cap() - p.committed) / need
		grown += max(t.cqLimit-p.committed, 0) / need
	}
	if t.cfg.SharedReceives > 0 && grown > held {
		return max(min(DefaultMaxConns, grown), held, 1)
	}
	return max(held, 1)
}

// commitPoller picks the poller whose completion queue has the most room for need more
// entries and commits them, growing the least committed queue (verbs.CQResizer, doubling
// up to the device's MaxCQE) when none has room: a queue that overran would lose
// completions, and every connection on it, so it is never over-committed. It returns nil
// when no queue can take them. t.mu is held.
func (t *Transport) commitPoller(need int) *poller {
	var p, least *poller
	for _, q := range t.pollers {
		if q.committed+need <= q.cq.Cap() && (p == nil || q.committed < p.committed) {
			p = q
		}
		if least == nil || q.committed < least.committed {
			least = q
		}
	}
	if p == nil && least != nil {
		want, capacity := least.committed+need, least.cq.Cap()
		if want <= t.cqLimit {
			if err := verbs.ResizeCQ(least.cq, min(max(2*capacity, want), t.cqLimit)); err == nil {
				p = least
			}
		}
	}
	if p != nil {
		p.committed += need
	}
	return p
}

// hostState is what one peer host holds of the server: connections and the rate at which
// it opens them (Transport.mu), and calls in the handlers (MaxCallsPerHost). It stays in
// Transport.hosts while the host has connections or its rate bucket is not full.
type hostState struct {
	ip     string
	conns  int
	tokens float64   // connections it may open now (ConnRatePerHost, burst MaxConnsPerHost)
	filled time.Time // when tokens was brought up to date
	calls  atomic.Int32
}

// refill brings the host's bucket up to now and reports whether it is full.
func (hs *hostState) refill(now time.Time, cfg *Config) bool {
	burst := float64(cfg.MaxConnsPerHost)
	hs.tokens = min(burst, hs.tokens+now.Sub(hs.filled).Seconds()*cfg.ConnRatePerHost)
	hs.filled = now
	return hs.tokens >= burst
}

// admit counts a connection in, or says why not: Config.MaxConns, or for one Serve
// accepted (ip set: the peer's address), Config.MaxConnsPerHost. It returns the host's
// state for an accepted one. leave counts it out.
func (t *Transport) admit(ip string) (*hostState, wire.Refusal, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	hs := t.hosts[ip]
	now := time.Now()
	if hs != nil {
		hs.refill(now, &t.cfg)
	}
	switch {
	case t.closed:
		return nil, wire.RefusedClosing, fmt.Errorf("%w: the transport is closed", ErrUnavailable)
	case t.open >= t.cfg.MaxConns:
		return nil, wire.RefusedConns, fmt.Errorf("%w: %w: %d connections open or being set up (Config.MaxConns; by default what the completion queues of Config.Pollers hold)",
			ErrUnavailable, ErrCapacity, t.open)
	case hs != nil && hs.conns >= t.cfg.MaxConnsPerHost:
		return nil, wire.RefusedHost, fmt.Errorf("%w: %w: %d connections from %s (Config.MaxConnsPerHost)", ErrUnavailable, ErrCapacity, hs.conns, ip)
	case hs != nil && hs.tokens < 1:
		return nil, wire.RefusedRate, fmt.Errorf("%w: %w: %s opens connections faster than %g a second (Config.ConnRatePerHost)", ErrUnavailable, ErrCapacity, ip, t.cfg.ConnRatePerHost)
	}
	t.open++
	if ip == "" {
		return nil, 0, nil
	}
	if hs == nil {
		if len(t.hosts) >= t.sweepAt {
			t.sweepHostsLocked(now)
		}
		hs = &hostState{ip: ip, tokens: float64(t.cfg.MaxConnsPerHost), filled: now}
		t.hosts[ip] = hs
	}
	hs.conns++
	hs.tokens--
	return hs, 0, nil
}

// sweepHostsLocked forgets hosts with no connection whose rate bucket is full again: they
// are as if never seen. t.mu is held.
func (t *Transport) sweepHostsLocked(now time.Time) {
	for ip, hs := range t.hosts {
		if hs.conns == 0 && hs.refill(now, &t.cfg) {
			delete(t.hosts, ip)
		}
	}
	t.sweepAt = max(1024, 2*len(t.hosts))
}

func (t *Transport) leave(hs *hostState) {
	t.mu.Lock()
	t.leaveLocked(hs)
	t.mu.Unlock()
}

func (t *Transport) leaveLocked(hs *hostState) {
	t.open--
	if hs != nil {
		hs.conns-- // the state stays for its rate bucket; sweepHostsLocked forgets it
	}
}

// hostOf is the key MaxConnsPerHost counts by: the peer's IP address.
func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return a.String()
}

// refuse turns nc away with a refusal record in the place of the server's hello, so the
// client can say why. The client's hello may be unread: closing over it would reset the
// connection and could destroy the refusal before the client reads it, so the stream is
// half-closed and drained first, by one of a bounded number of goroutines (beyond them it
// is closed at once: under a flood, a reset is answer enough).
func (t *Transport) refuse(nc net.Conn, r wire.Refusal) {
	_ = nc.SetDeadline(time.Now().Add(time.Second))
	_, _ = nc.Write(wire.AppendRefusal(nil, r))
	select {
	case t.seeing <- struct{}{}:
	default:
		_ = nc.Close()
		return
	}
	go func() {
		defer func() { <-t.seeing }()
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
		_ = nc.Close()
	}()
}

// Pool returns the transport's registered buffer pool, for callers that build large
// payloads in registered memory (see Conn.CallBuf and ResponseWriter.Buffer).
func (t *Transport) Pool() *pool.Pool { return t.pool }

// Dial connects to a transport serving at address, "host:port" (TCP) or
// "shm:///path/to.sock" (the shm fabric, same host), and returns the connection.
func (t *Transport) Dial(ctx context.Context, address string) (*Conn, error) {
	nc, err := dialStream(ctx, address, t.cfg.SHM())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err) // the net error names the address
	}
	if _, _, err := t.admit(""); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("%s: %w", address, err)
	}
	c, err := t.setupConn(ctx, nc, address, roleClient, nil)
	if err != nil {
		t.leave(nil)
		return nil, fmt.Errorf("%s: %w", address, err)
	}
	return c, nil
}

// dialStream opens the stream a connection is set up over: a shm target's with sc.
func dialStream(ctx context.Context, address string, sc shm.Config) (net.Conn, error) {
	if path, ok := shm.ParseTarget(address); ok {
		return shm.Dial(ctx, path, sc)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", address)
}

// Serve accepts connections on ln until ln is closed or the transport is, setting each up
// in its own goroutine. It returns nil when ln was closed, else the listener's error.
func (t *Transport) Serve(ln net.Listener) error {
	for {
		nc, err := ln.Accept()
		if err != nil {
			if t.isClosed() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		hs, r, err := t.admit(hostOf(nc.RemoteAddr()))
		if err != nil {
			t.counters.events[evRefused].Add(1)
			t.events.log(evRefused, slog.LevelWarn, "mwrpc: connection refused", "peer", nc.RemoteAddr().String(), "err", err)
			t.refuse(nc, r)
			continue
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), t.cfg.HandshakeTimeout)
			defer cancel()
			if _, err := t.setupConn(ctx, nc, "", roleServer, hs); err != nil { // nc is closed: the peer sees it
				t.leave(hs)
				t.counters.events[evSetup].Add(1)
				t.events.log(evSetup, slog.LevelWarn, "mwrpc: connection setup failed", "peer", nc.RemoteAddr().String(), "err", err)
			}
		}()
	}
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// NewConn sets up a connection over an established stream (either side may call it; both
// sides must): the hello exchange, a queue pair connected with cm, receive slots posted.
// The stream belongs to the connection (or is closed) afterwards.
func (t *Transport) NewConn(ctx context.Context, nc net.Conn) (*Conn, error) {
	if _, _, err := t.admit(""); err != nil {
		_ = nc.Close()
		return nil, err
	}
	c, err := t.setupConn(ctx, nc, "", roleNone, nil)
	if err != nil {
		t.leave(nil)
	}
	return c, err
}

// handshakeRole says which side of the credentials' handshake setupConn runs.
type handshakeRole uint8

const (
	roleNone   handshakeRole = iota // the stream is taken as it is (NewConn)
	roleClient                      // Dial: authenticate the server at the dialed address
	roleServer                      // Serve
)

// setupConn sets a connection up over nc, after the credentials' handshake when the
// transport has credentials and role asks for one. The connection was admitted (with hs,
// for one Serve accepted); when setup fails the caller counts it out, otherwise it counts
// itself out when it is torn down.
func (t *Transport) setupConn(ctx context.Context, nc net.Conn, authority string, role handshakeRole, hs *hostState) (*Conn, error) {
	// Close aborts setups in progress (by closing their streams) and waits for them, so
	// that no connection outlives the pollers it was assigned to.
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		_ = nc.Close()
		return nil, fmt.Errorf("%w: the transport is closed", ErrUnavailable)
	}
	t.setup[nc] = struct{}{}
	t.setupWG.Add(1)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.setup, nc)
		t.mu.Unlock()
		t.setupWG.Done()
	}()
	ctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	peer := Peer{Addr: nc.RemoteAddr()}
	stream := nc
	if creds := t.cfg.Credentials; creds != nil && role != roleNone {
		var err error
		if role == roleClient {
			stream, peer.AuthInfo, err = creds.ClientHandshake(ctx, authority, nc)
		} else {
			stream, peer.AuthInfo, err = creds.ServerHandshake(ctx, nc)
		}
		if err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("%w: %w", ErrHandshake, err)
		}
	}
	c, err := t.newConn(ctx, stream, peer, hs, role == roleServer)
	if err != nil {
		_ = stream.Close()
		return nil, err
	}
	return c, nil
}

// Peer is the other side of a connection: its address and what the credentials'
// handshake established about it (nil without credentials).
type Peer struct {
	Addr     net.Addr
	AuthInfo credentials.AuthInfo
}

func (t *Transport) newConn(ctx context.Context, nc net.Conn, peerInfo Peer, hs *hostState, accepted bool) (*Conn, error) {
	cfg := &t.cfg
	hello := wire.Hello{Version: wire.Version, SlotSize: uint32(cfg.SlotSize), Credits: uint32(cfg.Credits),
		Inline: uint32(cfg.EagerThreshold), MaxMessage: uint32(cfg.MaxMessage)}
	var peer wire.Hello
	if err := exchangeHello(ctx, nc, &hello, &peer); err != nil {
		return nil, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: the transport is closed", ErrUnavailable)
	}
	// The poller with the most room in its CQ takes the connection: a CQ that overran
	// would lose completions (and every connection on it), so it is never over-committed.
	_, _, sendWR, recvWR := queueSizes(cfg, peer)
	need := sendWR + recvWR
	p := t.commitPoller(need)
	if p == nil {
		n := len(t.conns)
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: %w: the completion queues of all %d pollers are committed to %d connections (%d completions each, %d per queue): raise Config.Pollers or lower Credits and Windows",
			ErrUnavailable, ErrCapacity, len(t.pollers), n, need, t.pollers[0].cq.Cap())
	}
	t.mu.Unlock()
	c, err := newConn(t, p, peer)
	if err == nil {
		c.peer, c.host, c.accepted = peerInfo, hs, accepted
	}
	if err != nil {
		t.mu.Lock()
		p.committed -= need
		t.mu.Unlock()
		return nil, err
	}
	c.cqe = need
	if err := c.connect(ctx, nc); err != nil {
		c.destroy()
		return nil, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.destroy()
		return nil, fmt.Errorf("%w: the transport is closed", ErrUnavailable)
	}
	if err := c.failure(); err != nil { // failed during setup: torn down, or about to be
		t.mu.Unlock()
		c.destroy()
		return nil, err
	}
	t.conns[c] = struct{}{}
	c.admitted = true // teardown counts it out from here on
	if c.boot != nil {
		t.wg.Add(1)
		go c.watchPeer()
	}
	t.mu.Unlock()
	return c, nil
}

// exchangeHello sends ours and reads the peer's hello, bounded by ctx.
func exchangeHello(ctx context.Context, nc net.Conn, ours, peer *wire.Hello) error {
	in := make([]byte, wire.HelloLen)
	n, err := cm.ExchangeN(ctx, nc, "hello", wire.AppendHello(nil, ours), in)
	if err != nil {
		if notOurs := notMwrpc(in[:n]); notOurs != nil { // it answered, and not as mwrpc
			return fmt.Errorf("%w: %w (then: %w)", ErrHandshake, notOurs, err)
		}
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	if _, err := wire.ParseHello(in, peer); err != nil {
		switch {
		case wire.RefusalError(in) != nil:
			return fmt.Errorf("%w: %w", ErrUnavailable, wire.RefusalError(in))
		case bytes.HasPrefix(in, credentials.PlaintextRefusal[:6]):
			err = fmt.Errorf("%w: the server requires TLS: configure transport credentials (Config.Credentials, rpc.WithTransportCredentials)", credentials.ErrPlaintextPeer)
		case in[0] == 0x16 && in[1] == 0x03: // a TLS record: handshake
			err = fmt.Errorf("%w: the peer speaks TLS and this side has no transport credentials (Config.Credentials, rpc.WithTransportCredentials)", credentials.ErrPlaintextPeer)
		default:
			if notOurs := notMwrpc(in); notOurs != nil {
				err = notOurs
			}
		}
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	return nil
}

// GoAway sends GOAWAY on every connection: peers stop sending new calls on them.
func (t *Transport) GoAway(ctx context.Context) {
	t.mu.Lock()
	conns := make([]*Conn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		_ = c.GoAway(ctx)
	}
}

// WaitIdle waits until no handler is running, or ctx ends.
func (t *Transport) WaitIdle(ctx context.Context) error { return t.running.wait(ctx) }

// Close closes every connection (their calls fail with ErrUnavailable), stops the pollers
// and releases the pool and the PD. Handlers still running finish first.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fmt.Errorf("mwrpc: close: %w", verbs.ErrClosed)
	}
	t.closed = true
	for nc := range t.setup {
		_ = nc.Close()
	}
	t.mu.Unlock()
	t.setupWG.Wait()
	t.mu.Lock()
	conns := make([]*Conn, 0, len(t.conns))
	for c := range t.conns {
		conns = append(conns, c)
	}
	t.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return t.closeResources()
}

func (t *Transport) closeResources() error {
	for _, p := range t.pollers {
		p.stop()
	}
	t.wg.Wait()
	_ = t.running.wait(context.Background())      // their contexts are canceled; their memory returns as they end
	_ = t.workers.ReleaseTimeout(5 * time.Second) // waits for its own goroutines too
	var errs []error
	for _, p := range t.pollers {
		p.closeShared() // after every QP, which the pollers destroyed before they stopped
		errs = append(errs, p.cq.Destroy())
	}
	errs = append(errs, t.pool.Close(), t.pd.Dealloc())
	return errors.Join(errs...)
}

func (t *Transport) forget(c *Conn) {
	t.mu.Lock()
	c.p.committed -= c.cqe
	c.cqe = 0
	delete(t.conns, c)
	if c.admitted {
		c.admitted = false
		t.leaveLocked(c.host)
	}
	t.mu.Unlock()
}

// Stats are a transport's counters, over all its connections since New.
type Stats struct {
	Calls        uint64 // calls made (Call, CallBuf)
	Served       uint64 // requests handed to the handler
	Streams      uint64 // streams opened, by this side or the peer
	Inline       uint64 // requests whose handler ran where they were reaped (InlineHandlers, InlineBudget)
	Polled       uint64 // calls whose response came while their caller polled for it (Config.BusyPoll)
	Corked       uint64 // requests held back for the requests of callers woken with them (corks.go)
	WindowsBound uint64 // large messages exposed through a window
	Reads        uint64 // large messages fetched with RDMA READ
	RevokedPeer  uint64 // our windows revoked by the peer's SEND_WITH_INV
	Reclaimed    uint64 // our windows revoked by LOCAL_INV (lease expiry)
	EagerBytes   uint64 // payload bytes sent inside SENDs
	Stalled      uint64 // connections failed because the peer returned no credit for CreditTimeout
	Crowded      uint64 // requests refused because their connection had MaxCallsPerConn in flight
	Overloaded   uint64 // requests refused because every handler was busy
	Refused      uint64 // connections Serve turned away (MaxConns, MaxConnsPerHost)
	SetupFailed  uint64 // connections Serve accepted whose setup failed (hello, TLS, timeout)
	Protocol     uint64 // connections failed because the peer broke the protocol (ErrProtocol)
	Access       uint64 // of those, the ones whose peer named a key or range it may not use
	IdleClosed   uint64 // connections closed after IdleTimeout without a request
	ReadBytes    uint64 // payload bytes fetched with RDMA READ
	Written      uint64 // responses written into the caller's request window (RDMA WRITE) instead of exposed for a READ
	TooManyPings uint64 // connections sent GOAWAY because the client pinged too often (Config.Keepalive)
	Granted      uint64 // grants given to callers: memory a next large request may be written into (Config.GrantBytes)
	Pushed       uint64 // large requests written into the peer's grant (RDMA WRITE) instead of exposed for a READ
	PushedIn     uint64 // large requests the peer wrote into a grant of ours
	// CopyPolls are the large transfers of a connection's lone call (its request written
	// into a grant, its response written) whose copy by the peer this side's reader was
	// told to poll through instead of sleeping (the shm fabric: Conn.peerCopies).
	CopyPolls  uint64
	Unshared   uint64 // messages copied out of their receive slot rather than hold it: a response while callers hold responses in half the connection's credits, a stream's opening request (SharedReceives), or any while the shared slots are crowded
	Sends      uint64 // messages sent: SENDs posted (with or without invalidation), every kind
	StreamAcks uint64 // stream acks sent as messages of their own (an ack riding a stream message is not one)
	Conns      int    // connections set up and not yet closed
	// WindowsExposed are the windows of live connections bound now (or being revoked):
	// memory a peer may still READ. It returns to 0 when no call is in flight.
	WindowsExposed int
	// Grants are the grants given to callers and not yet used, revoked or reclaimed:
	// windows a peer may write one request into (not counted in WindowsExposed).
	Grants      int
	Handlers    int // handlers running now
	HandlersCap int // the handler pool's size (Config.Handlers)
	Pool        pool.Stats
}

type counters struct {
	streams, bound, reads, revoked, reclaimed, readBytes, access, idleClosed, unshared, written, granted, pushed, pushedIn, copyPolls atomic.Uint64
	events                                                                                                                            [numEvents]atomic.Uint64
	hot                                                                                                                               [hotStripes]hotCounters
	nextHot                                                                                                                           atomic.Uint32
}

// hotCounters are the counters every message adds to, in stripes: a connection counts in
// one of its own (Conn.hot), so that callers on different connections (a Client's lanes, a
// server's peers), each on its own core, do not all write one cache line per call.
type hotCounters struct {
	calls, served, inline, polled, corked, sends, eagerBytes, streamAcks atomic.Uint64
	_                                                                    [cacheLine - 8*8]byte
}

// hotStripes is how many stripes the hot counters have: connections take them in turn.
const hotStripes = 16

// cacheLine is what a stripe is padded to: two 64-byte lines, as the adjacent-line
// prefetcher of x86 cores pulls pairs.
const cacheLine = 128

// hotSums are the hot counters' stripes summed.
type hotSums struct{ calls, served, inline, polled, corked, sends, eagerBytes, streamAcks uint64 }

// hotTotals sums the stripes of the hot counters.
func (c *counters) hotTotals() (h hotSums) {
	for i := range c.hot {
		s := &c.hot[i]
		h.calls += s.calls.Load()
		h.served += s.served.Load()
		h.inline += s.inline.Load()
		h.polled += s.polled.Load()
		h.corked += s.corked.Load()
		h.sends += s.sends.Load()
		h.eagerBytes += s.eagerBytes.Load()
		h.streamAcks += s.streamAcks.Load()
	}
	return h
}

// Stats returns a snapshot of the transport's counters. It costs about a nanosecond per
// pooled buffer (see pool.Pool.Stats) and takes the transport's lock once: call it from a
// metrics collector, not per call.
func (t *Transport) Stats() Stats {
	c := &t.counters
	hot := c.hotTotals()
	t.mu.Lock()
	conns, exposed := len(t.conns), 0
	for c := range t.conns {
		ws := c.win.ws.Stats()
		exposed += ws.Bound + ws.Invalidating
	}
	grants := int(t.grants.Load())
	exposed = max(exposed-grants, 0)
	t.mu.Unlock()
	return Stats{Calls: hot.calls, Served: hot.served, Streams: c.streams.Load(), Inline: hot.inline, Polled: hot.polled, Corked: hot.corked, WindowsBound: c.bound.Load(), Reads: c.reads.Load(),
		RevokedPeer: c.revoked.Load(), Reclaimed: c.reclaimed.Load(),
		EagerBytes: hot.eagerBytes, ReadBytes: c.readBytes.Load(), Conns: conns, WindowsExposed: exposed, Grants: grants,
		Stalled: c.events[evStalled].Load(), Crowded: c.events[evCrowded].Load(), Overloaded: c.events[evOverloaded].Load(),
		Refused: c.events[evRefused].Load(), SetupFailed: c.events[evSetup].Load(), Protocol: c.events[evProtocol].Load(),
		Access: c.access.Load(), IdleClosed: c.idleClosed.Load(), Unshared: c.unshared.Load(), Written: c.written.Load(),
		Granted: c.granted.Load(), Pushed: c.pushed.Load(), PushedIn: c.pushedIn.Load(), CopyPolls: c.copyPolls.Load(),
		TooManyPings: c.events[evPings].Load(), Sends: hot.sends, StreamAcks: hot.streamAcks,
		Handlers: t.running.count(), HandlersCap: t.cfg.Handlers, Pool: t.pool.Stats()}
}
