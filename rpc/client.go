package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/credentials"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// Client calls services on one or more servers. It keeps one connection per endpoint and
// more as the load asks (lanes, up to GOMAXPROCS; WithLanes pins the count), reconnects
// with backoff when one fails, pings idle ones, and spreads calls over the endpoints that
// are up and over each endpoint's lanes. With a resolver (a dns:/// target, WithResolver) the endpoints
// follow the resolver's answers. It is safe for concurrent use.
type Client struct {
	opts    dialOptions
	invoker UnaryInvoker
	tel     *telemetry // nil: off
	tr      *transport.Transport
	ownDev  verbs.Device
	eps     atomic.Pointer[[]*endpoint] // the endpoints: an immutable slice, replaced whole (publish)
	epsMu   sync.Mutex                  // guards want and leaving, and serializes replacing eps
	want    []*endpoint                 // the endpoints of the addresses (eps: want, then leaving)
	leaving []*endpoint                 // removed, kept while no endpoint of want is up (update)
	next    atomic.Uint32
	// up is closed and replaced whenever an endpoint comes up or a dial fails. A call loads
	// it before it looks for a connection (no lock: every call of every caller does).
	up     atomic.Pointer[chan struct{}]
	closed chan struct{}
	ctx    context.Context // ends when the client closes
	cancel context.CancelFunc
	wg     sync.WaitGroup

	name       string        // the target as given, for errors and logs
	resolver   Resolver      // nil: a fixed list of addresses
	resolveNow chan struct{} // asks resolveLoop to resolve again (reresolve)
	resolveMu  sync.Mutex
	resolveErr error // of the last resolution; nil if it succeeded

	lend lender // memory lent to callers: Buffer's, and responses (WithLentResponses)
}

type endpoint struct {
	addr        string
	conn        atomic.Pointer[transport.Conn]
	outstanding atomic.Int64
	callBytes   atomic.Int64          // a recent call's request and response bytes, over shm (noteCallBytes)
	lastHeard   atomic.Int64          // unix nanos of the last response: keepalive pings a connection silent since
	lastErr     atomic.Pointer[error] // why the last dial or connection failed (an atomic.Value panics on errors of different types)
	tried       atomic.Bool           // the first dial has ended, either way
	// reconnecting: the endpoint lost a connection that was up (it failed, or its server
	// sent GOAWAY, as MaxConnectionAge does) and has not yet a new one that takes calls,
	// nor a failed redial: fail-fast calls that find no endpoint wait for it (connFor).
	reconnecting atomic.Bool
	// health is what the health check (WithHealthCheck) last saw, for the connection it
	// names: the endpoint is healthy while that is its connection and err is nil.
	health   atomic.Pointer[healthState]
	healthMu sync.Mutex // serializes storing health (setHealth)

	ctx     context.Context // ends when the endpoint is removed (update) or the client closes
	cancel  context.CancelFunc
	leaving atomic.Bool // removed, but kept until another endpoint is up (update)

	lanes lanes // its connections beyond conn (lanes.go)
}

// Dial connects to target, one address ("host:port") or several separated by commas (or
// another form of target: see NewClient), and returns once at least one endpoint is
// connected (and healthy, with WithHealthCheck). Until then it retries each endpoint with the reconnection backoff
// (WithBackoff): a server that is not up yet is waited for, like grpc.WithBlock. It gives up when ctx ends, with Unavailable and the last error of each
// endpoint; give ctx a deadline unless waiting forever is right. An address that cannot
// be dialed at all (no port, a malformed host:port) is InvalidArgument, at once. The other
// endpoints keep connecting in the background. A target that is resolved (dns:///) is
// resolved again until ctx ends while it gives no address; Dial then fails with
// Unavailable saying that resolving failed, and why.
func Dial(ctx context.Context, target string, opts ...DialOption) (*Client, error) {
	c, err := NewClient(target, opts...)
	if err != nil {
		return nil, err
	}
	for {
		up := *c.up.Load()
		// Up once one endpoint is, and each has had its first try (so that the first
		// calls spread over all the endpoints that answer at once).
		eps := *c.eps.Load()
		// refused: by every endpoint, for a reason no retry changes
		tried, refused := true, len(eps) > 0
		for _, ep := range eps {
			e := ep.lastError()
			refused = refused && e != nil && permanent(e)
			tried = tried && ep.tried.Load()
		}
		if tried && c.pick() != nil {
			return c, nil
		}
		var done <-chan struct{} = ctx.Done()
		if refused {
			closed := make(chan struct{})
			close(closed)
			done = closed
		}
		select {
		case <-up:
		case <-done:
			if len(eps) == 0 { // resolution never gave an address
				cause := c.lastResolveErr()
				if cause == nil {
					cause = fmt.Errorf("resolving %s: %w", c.name, ctx.Err())
				}
				_ = c.Close()
				return nil, &Status{Code: Unavailable, Message: fmt.Sprintf("mwrpc: dial: %v (%v)", cause, ctx.Err()), cause: cause}
			}
			errs := make([]error, 0, len(eps))
			for _, ep := range eps {
				if e := ep.healthErr(); e != nil && c.opts.healthCheck {
					errs = append(errs, e) // connected, but not healthy
				} else if e := ep.lastError(); e != nil {
					errs = append(errs, e)
				}
			}
			cause := errors.Join(errs...)
			_ = c.Close()
			if cause == nil {
				cause = ctx.Err()
			}
			why := "not retried: retrying cannot change that"
			if err := ctx.Err(); err != nil {
				why = err.Error()
			}
			// Each endpoint's error names its address.
			return nil, &Status{Code: Unavailable, Message: fmt.Sprintf("mwrpc: dial: %v (%s)", cause, why), cause: cause}
		}
	}
}

// NewClient returns a client of target at once and connects in the background, as
// grpc.NewClient does: calls fail with Unavailable while no endpoint is up, unless they
// pass WaitForReady; a call that finds no endpoint up while one reconnects after losing a
// connection (it failed, or was sent GOAWAY) waits for that dial, as gRPC's wait while a
// channel is CONNECTING. A target is one of
//
//	host:port[,host:port...]     a fixed list of addresses
//	static:///host:port[,...]    the same
//	dns:///host:port             the A and AAAA records of host (WithDNSLookup)
//	dns:///_service._proto.name  the SRV records of the name (see DNSResolver)
//	dns://server[:port]/name     either, asking the DNS server at server:port (53 by default)
//
// A dns:/// target is resolved again every resolve interval and, at most once per the
// minimum interval, when a connection or a dial fails (WithResolveInterval); endpoints
// follow the answers. WithResolver makes target only a name, and resolves with its
// resolver. A target that cannot be read (an unknown scheme, no host, no port) or an
// address that cannot be dialed at all is InvalidArgument.
func NewClient(target string, opts ...DialOption) (*Client, error) {
	c := &Client{closed: make(chan struct{}), name: target, resolveNow: make(chan struct{}, 1)}
	up := make(chan struct{})
	c.up.Store(&up)
	c.eps.Store(new([]*endpoint))
	for _, o := range opts {
		o.applyDial(&c.opts)
	}
	o := &c.opts
	if o.codec == nil {
		o.codec = codec.Msgpack{}
	}
	if !o.keepaliveSet { // off, as in gRPC: TCP keepalive (transport.Config.PeerTimeout) notices a dead peer
		o.keepaliveTime, o.keepaliveTimeout = 0, 0
	}
	if o.backoffBase <= 0 {
		o.backoffBase = 50 * time.Millisecond
	}
	if o.backoffMax < o.backoffBase {
		o.backoffMax = max(o.backoffBase, 2*time.Second)
	}
	if o.resolveInterval <= 0 {
		o.resolveInterval = 30 * time.Second
	}
	if o.resolveMin <= 0 {
		o.resolveMin = 5 * time.Second
	}
	o.resolveMin = min(o.resolveMin, o.resolveInterval)
	resolver, static, peer, err := parseTarget(target, o)
	if err != nil {
		return nil, &Status{Code: InvalidArgument, Message: "mwrpc: " + err.Error(), cause: err}
	}
	dev := o.device
	if dev == nil {
		d, err := soft.OpenTCP("mwrpc-client")
		if err != nil {
			return nil, err
		}
		dev, c.ownDev = d, d
	}
	tcfg := o.transport
	if o.creds != nil {
		tcfg.Credentials = o.creds
	}
	tr, err := transport.New(dev, nil, tcfg)
	if err != nil {
		if c.ownDev != nil {
			_ = c.ownDev.Close()
		}
		return nil, err
	}
	c.tr = tr
	c.invoker = chainClient(o.interceptors, c.invoke)
	c.tel = newTelemetry(o.telemetry, false)
	c.tel.setPeer(peer)
	c.tel.observeTransport(tr)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if resolver != nil {
		c.resolver = resolver
		c.wg.Add(1)
		go c.resolveLoop()
		return c, nil
	}
	eps := make([]*endpoint, len(static)) // as listed: the same address twice is two endpoints
	for i, a := range static {
		eps[i] = c.newEndpoint(a)
	}
	c.want = eps
	c.eps.Store(&eps)
	for _, ep := range eps {
		c.wg.Add(1)
		go c.maintain(ep)
	}
	return c, nil
}

// permanent reports whether a dial failed for a reason retrying does not change: the
// peer's credentials or ours (a certificate refused, TLS on one side only). Dial stops
// waiting when every endpoint failed so; the client goes on retrying in the background,
// as the server may be reconfigured.
func permanent(err error) bool {
	var op *net.OpError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var verify *tls.CertificateVerificationError
	return errors.Is(err, credentials.ErrPlaintextPeer) || errors.Is(err, transport.ErrNotMwrpcPeer) || errors.As(err, &unknown) || errors.As(err, &invalid) ||
		errors.As(err, &host) || errors.As(err, &verify) ||
		errors.As(err, &op) && op.Op == "remote error" // a TLS alert from the peer: it refused our certificate
}

// checkAddress refuses what no retry can dial: a missing or malformed port, a malformed
// host:port.
func checkAddress(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w (want host:port)", addr, err)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("address %q: bad port: %w", addr, err)
	}
	return nil
}

// Close closes every connection; calls in flight fail with Unavailable.
func (c *Client) Close() error {
	select {
	case <-c.closed:
		return Errorf(Canceled, "mwrpc: client already closed")
	default:
	}
	close(c.closed)
	c.cancel() // after closed: an endpoint's maintainer sees the client closing, not a removal
	c.wg.Wait()
	c.lend.closeAll() // before the transport, whose memory it is
	c.tel.stopObserving()
	err := c.tr.Close()
	if c.ownDev != nil {
		err = errors.Join(err, c.ownDev.Close())
	}
	return err
}

// maintain keeps one endpoint connected: it redials with backoff after a failure or a
// GOAWAY, and pings the connection when it has been idle for the keepalive interval. Each
// failure asks the resolver, if any, to resolve again. When the endpoint is removed, it
// lets the endpoint's calls finish, closes the connection and returns.
func (c *Client) maintain(ep *endpoint) {
	defer c.wg.Done()
	c.wg.Add(1)
	go c.maintainLanes(ep)
	pings := newPingSchedule(c.opts.keepaliveTime)
	defer pings.stop()
	backoff := c.opts.backoffBase
	for {
		var more bool
		if conn := ep.conn.Load(); conn == nil {
			more = c.connect(ep, &backoff)
		} else {
			more = c.watch(ep, conn, pings)
		}
		if !more {
			return
		}
	}
}

// pingSchedule is when one endpoint's maintainer pings its connection: every interval,
// doubled when a server says we ping too often. Owned by that maintainer goroutine.
type pingSchedule struct {
	interval time.Duration
	ticker   *time.Ticker     // nil when keepalive is off
	tick     <-chan time.Time // the ticker's channel; nil (never fires) when keepalive is off
}

func newPingSchedule(interval time.Duration) *pingSchedule {
	p := &pingSchedule{interval: interval}
	if interval > 0 {
		p.ticker = time.NewTicker(interval)
		p.tick = p.ticker.C
	}
	return p
}

func (p *pingSchedule) stop() {
	if p.ticker != nil {
		p.ticker.Stop()
	}
}

// connect dials ep once, for maintain; after a failure it waits out the backoff (which it
// grows; a success resets it). It returns false when maintain should return: the endpoint
// was removed (or is leaving and dropped), or the client is closing.
func (c *Client) connect(ep *endpoint, backoff *time.Duration) bool {
	if ep.leaving.Load() && c.dropLeaving(ep) {
		c.settled(ep)
		return false
	}
	if l := ep.lanes.take(); l != nil { // a lane takes the lost connection's place at once
		c.connected(ep, l)
		return true
	}
	ctx, cancel := context.WithTimeout(ep.ctx, 10*time.Second)
	nc, err := c.tr.Dial(ctx, ep.addr)
	cancel()
	if err != nil && ep.ctx.Err() != nil { // removed, or the client is closing
		c.settled(ep)
		return false
	}
	if err == nil {
		c.connected(ep, nc)
		*backoff = c.opts.backoffBase
		return true
	}
	ep.setLastErr(err)
	ep.tried.Store(true)
	ep.reconnecting.Store(false) // calls that waited for this redial fail now
	c.signalUp()                 // and Dial may be waiting to see that every endpoint refuses us
	c.reresolve()
	b := *backoff
	wait := b/2 + rand.N(b/2+1)
	*backoff = min(2*b, c.opts.backoffMax)
	// At Debug: every retry of a server that is down would otherwise flood the log.
	c.logger().Debug("mwrpc: connecting failed; retrying", slog.String("address", ep.addr), slog.Any("error", err), slog.Duration("retry_in", wait))
	select {
	case <-time.After(wait):
		return true
	case <-ep.ctx.Done():
		return false
	}
}

// connected makes nc ep's connection and tells whoever waits for one.
func (c *Client) connected(ep *endpoint, nc *transport.Conn) {
	ep.conn.Store(nc)
	ep.tried.Store(true)
	if c.opts.healthCheck { // after the Store: it records health for nc only while nc is ep's
		c.wg.Add(1)
		go c.watchHealth(ep, nc)
	} else {
		ep.reconnecting.Store(false) // it takes calls now (with the check: at its first status)
	}
	c.signalUp()
	ep.lanes.wake() // its lanes follow it
	if c.resolver != nil {
		c.settle() // endpoints removed from the answer may wait for this one
	}
}

// watch waits, for maintain, until ep's connection conn needs something: it failed or its
// server sent GOAWAY (ep loses it: the next round dials), or it is due a ping. It returns
// false when the endpoint was removed (or the client is closing): conn is retired then.
func (c *Client) watch(ep *endpoint, conn *transport.Conn, pings *pingSchedule) bool {
	select {
	case <-ep.ctx.Done():
		c.retire(ep)
		return false
	case <-conn.Done():
		if err := conn.Err(); err != nil {
			ep.setLastErr(fmt.Errorf("%s: %w", ep.addr, err))
		}
		ep.lose(conn)
		c.reresolve()
	case <-conn.GoingAway():
		// New calls go elsewhere (or to a new connection); this one finishes its own.
		c.wentAway(ep, conn, pings)
		ep.lose(conn)
		c.reresolve()
		go c.drainClose(conn) // its own calls finish, then it closes
	case <-pings.tick:
		c.ping(ep, conn, pings)
	}
	return true
}

// heard records that ep answered, for keepalive's ping (a clock read and a store to a line
// every caller of ep writes, so only where keepalive is on).
func (c *Client) heard(ep *endpoint) {
	if c.opts.keepaliveTime > 0 {
		ep.lastHeard.Store(time.Now().UnixNano())
	}
}

// ping checks, on keepalive's tick, that conn still answers, unless a response came
// within the interval; a connection that does not answer in time is closed and ep loses
// it. Only a response proves the connection works: calls that all time out (a wedged
// path) must not keep the ping away.
func (c *Client) ping(ep *endpoint, conn *transport.Conn, pings *pingSchedule) {
	if time.Since(time.Unix(0, ep.lastHeard.Load())) < pings.interval {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.keepaliveTimeout)
	err := conn.Ping(ctx)
	cancel()
	if err != nil {
		c.wentAway(ep, conn, pings) // the server may have said why
		ep.lose(conn)
		_ = conn.Close()
		c.reresolve()
	}
}

// wentAway records why conn's server sent GOAWAY, if it said, and slows pings down when
// the server said we ping too often.
func (c *Client) wentAway(ep *endpoint, conn *transport.Conn, pings *pingSchedule) {
	why := conn.GoAwayErr()
	if why == nil {
		return
	}
	ep.setLastErr(fmt.Errorf("%s: %w", ep.addr, why))
	if errors.Is(why, transport.ErrTooManyPings) && pings.ticker != nil {
		pings.interval = c.slowerPings(ep, pings.interval, why)
		pings.ticker.Reset(pings.interval)
	}
}

// slowerPings answers a server's GOAWAY for too many pings as gRPC's client does: it
// doubles the endpoint's keepalive interval and says so in the log.
func (c *Client) slowerPings(ep *endpoint, interval time.Duration, why error) time.Duration {
	next := 2 * interval
	c.logger().Warn("mwrpc: the server sent GOAWAY because this client pinged too often; pinging less often (rpc.WithKeepalive sets the interval)",
		"addr", ep.addr, "interval", next, "err", why)
	return next
}

func (c *Client) signalUp() {
	up := make(chan struct{})
	close(*c.up.Swap(&up))
}

// lose takes conn, which failed or was sent GOAWAY, from ep, which reconnects: reconnecting
// is set first, so that a call that finds ep without a connection knows to wait.
func (ep *endpoint) lose(conn *transport.Conn) {
	if ep.conn.Load() == conn {
		ep.reconnecting.Store(true)
	}
	ep.conn.CompareAndSwap(conn, nil)
}

// settled ends ep's reconnecting without a connection (removed, or the client closing),
// waking the calls that waited for it.
func (c *Client) settled(ep *endpoint) {
	if ep.reconnecting.Swap(false) {
		c.signalUp()
	}
}

// reconnecting says whether an endpoint reconnects after losing a connection that was up.
func (c *Client) reconnecting() bool {
	for _, ep := range *c.eps.Load() {
		if ep.reconnecting.Load() {
			return true
		}
	}
	return false
}

// usable says whether ep may take calls: its connection is up and, with WithHealthCheck,
// the last health status on that connection was SERVING.
func (c *Client) usable(ep *endpoint) bool {
	conn := ep.conn.Load()
	if conn == nil {
		return false
	}
	if !c.opts.healthCheck {
		return true
	}
	h := ep.health.Load()
	return h != nil && h.conn == conn && h.err == nil
}

// pick chooses an endpoint that is up (and healthy, with WithHealthCheck), by the
// balancer; nil if none is.
func (c *Client) pick() *endpoint {
	eps := *c.eps.Load()
	n := len(eps)
	if n == 0 {
		return nil
	}
	start := 0
	if n > 1 { // one endpoint: no counter every call of every caller writes
		start = int(c.next.Add(1))
	}
	if c.opts.balancer == LeastOutstanding { // ties go round robin
		var best *endpoint
		for i := 0; i < n; i++ {
			ep := eps[(start+i)%n]
			if c.usable(ep) && (best == nil || ep.outstanding.Load() < best.outstanding.Load()) {
				best = ep
			}
		}
		return best
	}
	for i := 0; i < n; i++ {
		if ep := eps[(start+i)%n]; c.usable(ep) {
			return ep
		}
	}
	return nil
}

// Invoke calls method with req and decodes the response into reply. See Invoker.
func (c *Client) Invoke(ctx context.Context, method string, req, reply any, opts ...CallOption) error {
	var cs callSpan
	ctx = c.tel.startClient(ctx, method, &cs) // interceptors see the span
	err := c.invoker(ctx, method, req, reply, opts...)
	c.tel.endErr(ctx, &cs, err)
	return err
}

// errSizeEstimate: a codec's Size was smaller than its encoding.
var errSizeEstimate = errors.New("mwrpc: codec size estimate too small")

var scratchPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func (c *Client) invoke(ctx context.Context, method string, req, reply any, opts ...CallOption) error {
	var ci callInfo
	applyOptions(&ci, opts)
	cod := c.opts.codec
	var raw []byte
	if isBytes(req) && isBytesPtr(reply) {
		cod = codec.Raw{}
		if b, ok := req.([]byte); ok { // as it is: Buffer's memory leaves without a copy
			req, raw = nil, b
		}
	}
	resp, body, err := c.roundTrip(ctx, method, cod, req, raw, &ci)
	if err != nil {
		return err
	}
	if p, ok := reply.(*[]byte); ok && cod == (codec.Raw{}) {
		*p = c.ownResponse(resp, body) // lent (WithLentResponses) or the caller's copy
		return nil
	}
	defer resp.Release()
	if err := cod.Unmarshal(body, reply); err != nil {
		return &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: decoding the response of %s: %v", method, err), cause: err}
	}
	return nil
}

// InvokeBytes calls a method on []byte both ways (BytesInvoker): nothing is encoded. A
// request in Buffer's memory leaves without a copy (and the call takes it); the response
// is the caller's own copy, or with WithLentResponses the transport's memory, lent until
// Release.
func (c *Client) InvokeBytes(ctx context.Context, method string, req []byte) ([]byte, error) {
	if len(c.opts.interceptors) > 0 { // interceptors see the usual Invoke
		var out []byte
		if err := c.Invoke(ctx, method, req, &out); err != nil {
			return nil, err
		}
		return out, nil
	}
	var cs callSpan
	ctx = c.tel.startClient(ctx, method, &cs)
	out, err := c.invokeBytes(ctx, method, req)
	c.tel.endErr(ctx, &cs, err)
	return out, err
}

func (c *Client) invokeBytes(ctx context.Context, method string, req []byte) ([]byte, error) {
	var ci callInfo
	resp, body, err := c.roundTrip(ctx, method, codec.Raw{}, nil, req, &ci)
	if err != nil {
		return nil, err
	}
	return c.ownResponse(resp, body), nil
}

// roundTrip sends one request, req encoded with cod (or, when req is nil, the bytes raw
// as they are: no boxing; taken when they are Buffer's), and returns the response and its
// body (valid until the response is released), or the call's status as an error.
func (c *Client) roundTrip(ctx context.Context, method string, cod codec.Codec, req any, raw []byte, ci *callInfo) (*transport.Response, []byte, error) {
	var lent *pool.Buf // Buffer's memory: the call's from here on, whatever its outcome
	if req == nil {
		lent = c.lend.takeRequest(raw)
	}
	if err := ctx.Err(); err != nil { // as gRPC: a call whose context already ended is not sent
		releaseBuf(lent)
		return nil, nil, StatusOf(err)
	}
	var ep *endpoint
	var resp *transport.Response
	var sent int
	for try := 1; ; try++ {
		var conn *transport.Conn
		var err error
		if ep, conn, err = c.connFor(ctx, ci.waitForReady); err != nil {
			releaseBuf(lent)
			return nil, nil, err
		}
		resp, sent, err = c.sendRequest(ctx, conn, method, cod, req, raw, lent)
		ep.outstanding.Add(-1)
		if err == nil {
			break
		}
		if lent != nil || !resend(ctx, err, try) { // Buffer's memory went with the call
			return nil, nil, StatusOf(err)
		}
	}
	if ep.lanes.byBytes {
		ep.noteCallBytes(sent + len(resp.Bytes()))
	}
	c.heard(ep)
	return c.readResponse(ctx, resp, ci)
}

// maxSends is how many times a call or stream that sent nothing is tried (resend).
const maxSends = 3

// resend says whether a call or stream whose try failed with err goes again: nothing of
// it was sent (transport.ErrNotSent: its connection failed or was closed between connFor
// and the send, as a connection sent GOAWAY is once its calls are done), its context
// goes on, and it has had fewer than maxSends tries. gRPC retries such calls too
// (transparent retry).
func resend(ctx context.Context, err error, try int) bool {
	return try < maxSends && errors.Is(err, transport.ErrNotSent) && ctx.Err() == nil
}

// sendRequest encodes the request (req with cod, or raw as it is) and calls conn with it:
// raw in lent (Buffer's memory, which sendRequest takes) is sent from there, a body that
// will go through a window (over the connection's eager limit) is built in registered
// memory, the rest in a pooled scratch buffer copied into the send slot. It returns the
// response and the bytes the request took, envelope included.
func (c *Client) sendRequest(ctx context.Context, conn *transport.Conn, method string, cod codec.Codec, req any, raw []byte, lent *pool.Buf) (*transport.Response, int, error) {
	var deadline int64
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl.UnixNano()
	}
	md := outgoing(ctx)
	if err := checkRequest(method, md); err != nil {
		releaseBuf(lent)
		return nil, 0, &Status{Code: InvalidArgument, Message: err.Error(), cause: err}
	}
	// Refuse what cannot travel before encoding it: a body of known size over the largest
	// message this connection may send (the smaller of both sides' MaxMessage).
	size, known := len(raw), req == nil
	if sz, ok := cod.(codec.Sizer); ok && req != nil {
		size, known = sz.Size(req)
	}
	if limit := conn.MaxSend(); known && size > limit {
		releaseBuf(lent)
		return nil, 0, &Status{Code: ResourceExhausted, Message: fmt.Sprintf("mwrpc: request of %s is %d bytes, over the maximum message size of %d bytes (transport.Config.MaxMessage, the smaller of both sides')", method, size, limit),
			cause: transport.ErrTooLarge}
	}
	if lent != nil {
		return c.callLent(ctx, conn, method, deadline, md, lent, len(raw))
	}
	// Raw bytes that fit a SEND with their envelope are copied once, straight into the
	// send slot behind the envelope (callScratch, Conn.CallParts).
	if req == nil && size+envelopeRoom(method, md) <= conn.EagerLimit() {
		return c.callScratch(ctx, conn, method, deadline, md, cod, req, raw)
	}
	// Over the eager limit the body must be in registered memory anyway; over scratchMax it
	// goes there too rather than grow a heap scratch buffer per call (the transport copies
	// one that fits a SEND into its send slot, and releases the buffer).
	if known && (size > conn.EagerLimit() || size > scratchMax) {
		resp, sent, err := c.callRegistered(ctx, conn, method, deadline, md, cod, req, raw, size)
		if !errors.Is(err, errSizeEstimate) {
			return resp, sent, err
		}
	}
	return c.callScratch(ctx, conn, method, deadline, md, cod, req, raw)
}

// scratchMax is the largest body callScratch encodes on the heap.
const scratchMax = 16 << 10

// callScratch encodes the request into a pooled scratch buffer and calls conn with it,
// which copies it into a send slot (or, over the eager limit, into registered memory).
// Raw bytes (req nil) are not copied to the scratch buffer: the envelope alone is built
// there, and conn copies both into the send slot (Conn.CallParts). It returns the response
// and the request's bytes, as sendRequest.
func (c *Client) callScratch(ctx context.Context, conn *transport.Conn, method string, deadline int64, md MD, cod codec.Codec, req any, raw []byte) (*transport.Response, int, error) {
	sp := scratchPool.Get().(*[]byte)
	b := appendRequest((*sp)[:0], method, deadline, md)
	b = c.tel.inject(ctx, b, md)
	body := raw
	if req != nil {
		var err error
		if b, err = appendBody(cod, b, req, conn.MaxSend()); err != nil {
			scratchPool.Put(sp)
			if errors.Is(err, codec.ErrTooLarge) {
				return nil, 0, &Status{Code: ResourceExhausted, Message: fmt.Sprintf("mwrpc: request of %s is over the maximum message size of %d bytes (transport.Config.MaxMessage, the smaller of both sides'): %v", method, conn.MaxSend(), err), cause: err}
			}
			return nil, 0, &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: encoding the request of %s: %v", method, err), cause: err}
		}
		body = nil
	}
	n := len(b) + len(body)
	c.tel.transfer(ctx, AttrRequestSize, AttrRequestTransfer, n, n > conn.EagerLimit())
	resp, err := conn.CallParts(ctx, b, body)
	if cap(b) <= 64<<10 {
		*sp = b[:0]
		scratchPool.Put(sp)
	}
	return resp, n, err
}

// readResponse parses a response's envelope: it returns the response and its body (valid
// until the response is released) on OK, else the status, the response released.
func (c *Client) readResponse(ctx context.Context, resp *transport.Response, ci *callInfo) (*transport.Response, []byte, error) {
	var r response
	perr := parseResponse(resp.Bytes(), &r)
	code := Code(resp.Status())
	if perr != nil {
		defer resp.Release()
		if code != OK { // produced by the transport itself (overload, panic): plain text
			return nil, nil, &Status{Code: code, Message: string(resp.Bytes())}
		}
		return nil, nil, &Status{Code: Internal, Message: perr.Error(), cause: perr}
	}
	if ci.trailer != nil {
		*ci.trailer = decodeMD(r.md, r.nmd)
	}
	if ci.header != nil {
		*ci.header = decodeMD(r.hdr, r.nhdr)
	}
	c.tel.transfer(ctx, AttrResponseSize, AttrResponseTransfer, len(resp.Bytes()), resp.Windowed())
	if code != OK {
		defer resp.Release()
		st := &Status{Code: code, Message: string(r.msg)}
		st.details, _ = decodeDetails(r.details) // malformed details are dropped; the code stands
		// The server can see our deadline (or cancel) before our own context says so: the
		// same event, so the status matches the context error too.
		if dl, ok := ctx.Deadline(); code == DeadlineExceeded && ok && !time.Now().Before(dl) {
			st.cause = context.DeadlineExceeded
		} else if code == Canceled && ctx.Err() != nil {
			st.cause = ctx.Err()
		}
		return nil, nil, st
	}
	return resp, r.body, nil
}

// appendBody encodes req behind b, stopping as soon as the message passes limit bytes
// when the codec can (codec.LimitAppender): an oversized request is refused after the
// encoding of what comes before its large field, not all of it.
func appendBody(cod codec.Codec, b []byte, req any, limit int) ([]byte, error) {
	if la, ok := cod.(codec.LimitAppender); ok {
		return la.AppendLimit(b, req, limit)
	}
	return cod.Append(b, req)
}

// callRegistered encodes the request (req with cod, or raw as it is) straight into a
// registered buffer and sends it from there: no copy between the codec and the NIC. The
// envelope is written there too (no scratch buffer, whose sync.Pool a garbage collection
// empties: an allocation per call when large payloads make one run every call). It
// returns the response and the request's bytes, as sendRequest.
func (c *Client) callRegistered(ctx context.Context, conn *transport.Conn, method string, deadline int64, md MD, cod codec.Codec, req any, raw []byte, n int) (*transport.Response, int, error) {
	room := envelopeRoom(method, md)
	buf, err := c.tr.Pool().Get(ctx, room+n)
	if err != nil {
		return nil, 0, &Status{Code: ResourceExhausted, Message: fmt.Sprintf("mwrpc: request buffer for %s: %v", method, err), cause: err}
	}
	if buf, err = c.envelopeInto(ctx, buf, room, method, deadline, md, n); err != nil {
		return nil, 0, err
	}
	probe.Mark(probe.CopyIn)
	b := buf.Bytes()
	switch at := len(b); {
	case req != nil:
		b, err = cod.Append(b, req)
	case cap(b)-at < len(raw): // no room behind the envelope: the caller sends it the usual way
		buf.Release()
		return nil, 0, errSizeEstimate
	default: // split over idle cores where the fabric makes that pay
		b = b[:at+len(raw)]
		conn.CopyIn(b[at:], raw)
	}
	probe.Mark(probe.CopyInDone)
	if err != nil {
		buf.Release()
		return nil, 0, &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: encoding the request of %s: %v", method, err), cause: err}
	}
	if len(b) > buf.Cap() || unsafe.SliceData(b) != unsafe.SliceData(buf.Bytes()) { // the codec's size was short: the caller encodes the usual way
		buf.Release()
		return nil, 0, errSizeEstimate
	}
	buf.SetLen(len(b))
	c.tel.transfer(ctx, AttrRequestSize, AttrRequestTransfer, len(b), len(b) > conn.EagerLimit())
	resp, err := conn.CallBuf(ctx, buf)
	return resp, len(b), err
}

// envelopeRoom is the room a request's envelope takes: its fixed part, the method, the
// metadata, and up to 128 bytes of trace context the telemetry may add.
func envelopeRoom(method string, md MD) int {
	n := reqFixed + len(method) + 128
	for k, vs := range md {
		for _, v := range vs {
			n += 6 + len(k) + len(v)
		}
	}
	return n
}

// envelopeInto writes the request's envelope at the start of buf, whose Len it sets to
// the envelope's, leaving room for n bytes of body behind it. An envelope over room (the
// telemetry's trace context larger than envelopeRoom allows) goes into a larger buffer,
// which replaces buf.
func (c *Client) envelopeInto(ctx context.Context, buf *pool.Buf, room int, method string, deadline int64, md MD, n int) (*pool.Buf, error) {
	mem := buf.Bytes()[:0:room] // an envelope that outgrows it moves to the heap
	env := appendRequest(mem, method, deadline, md)
	env = c.tel.inject(ctx, env, md)
	if unsafe.SliceData(env) == unsafe.SliceData(mem) {
		buf.SetLen(len(env))
		return buf, nil
	}
	buf.Release()
	buf, err := c.tr.Pool().Get(ctx, len(env)+n)
	if err != nil {
		return nil, &Status{Code: ResourceExhausted, Message: fmt.Sprintf("mwrpc: request buffer for %s: %v", method, err), cause: err}
	}
	buf.SetLen(copy(buf.Bytes()[:len(env)], env))
	return buf, nil
}

// connFor returns an endpoint and its working connection. With none up it fails with
// Unavailable at once, or, with WaitForReady, waits until one comes up or ctx ends.
func (c *Client) connFor(ctx context.Context, waitForReady bool) (*endpoint, *transport.Conn, error) {
	for {
		up := *c.up.Load()
		if ep := c.pick(); ep != nil {
			conn := ep.conn.Load()
			if c.opts.healthCheck && !ep.healthyOn(conn) {
				continue // a new connection since the pick, not yet known to be healthy
			}
			if conn != nil && conn.Err() == nil {
				ep.outstanding.Add(1) // from the pick on, so concurrent picks see it
				if ep.conn.Load() == conn {
					return ep, c.lane(ep, conn), nil
				}
				// Swapped out meanwhile (a removed endpoint draining, a GOAWAY): the
				// drain may not have counted this call, so it takes another.
				ep.outstanding.Add(-1)
				continue
			}
			if conn != nil { // failed before its maintainer noticed: nothing was sent on it
				ep.lose(conn)
			}
			continue
		}
		// A fail-fast call waits while an endpoint reconnects (as gRPC's calls wait while
		// a channel is CONNECTING): a server's MaxConnectionAge sends every connection
		// GOAWAY in turn, and the calls between it and the redial must not fail.
		if !waitForReady && !c.reconnecting() {
			if err := c.unhealthy(); err != nil {
				return nil, nil, err
			}
			if err := c.lastResolveErr(); err != nil {
				return nil, nil, &Status{Code: Unavailable, Message: fmt.Sprintf("mwrpc: no connection to %s is up (%v)", c.target(), err), cause: err}
			}
			return nil, nil, c.noConnection()
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, nil, c.waitedInVain(ctx)
		case <-c.closed:
			return nil, nil, Errorf(Unavailable, "mwrpc: client closed")
		}
	}
}

// noConnection is a fail-fast call's error when no endpoint is up: Unavailable with the
// endpoints' last connection errors as its cause (connection refused, a TLS certificate
// refused, ...), or saying that the first connection is still being set up.
func (c *Client) noConnection() error {
	last, tried := c.lastErrs()
	switch {
	case last != nil:
		return &Status{Code: Unavailable, Message: fmt.Sprintf("mwrpc: no connection to %s is up: %v", c.target(), last), cause: last}
	case !tried:
		return Errorf(Unavailable, "mwrpc: no connection to %s is up yet (the first is being set up; WaitForReady waits for it)", c.target())
	}
	return Errorf(Unavailable, "mwrpc: no connection to %s is up", c.target())
}

// waitedInVain is the error of a WaitForReady call whose context ended before a
// connection came up: the context's, with the endpoints' last connection errors.
func (c *Client) waitedInVain(ctx context.Context) error {
	st := StatusOf(ctx.Err())
	last, _ := c.lastErrs()
	if last == nil {
		return st
	}
	return &Status{Code: st.Code, Message: fmt.Sprintf("%v while waiting for a connection to %s: %v", ctx.Err(), c.target(), last),
		cause: errors.Join(ctx.Err(), last)}
}

func (ep *endpoint) setLastErr(err error) { ep.lastErr.Store(&err) }

// lastError is why ep's last dial or connection failed, or nil.
func (ep *endpoint) lastError() error {
	if p := ep.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// lastErrs joins the last connection error of each endpoint (nil if none has one), and
// says whether every endpoint has had its first dial.
func (c *Client) lastErrs() (last error, tried bool) {
	var errs []error
	tried = true
	for _, ep := range *c.eps.Load() {
		if e := ep.lastError(); e != nil {
			errs = append(errs, e)
		}
		tried = tried && ep.tried.Load()
	}
	return errors.Join(errs...), tried
}

// target names what the client connects to: its addresses, and the target they were
// resolved from, if they were.
func (c *Client) target() string {
	eps := *c.eps.Load()
	addrs := make([]string, len(eps))
	for i, ep := range eps {
		addrs[i] = ep.addr
	}
	if c.resolver != nil {
		return fmt.Sprintf("%s [%s]", c.name, strings.Join(addrs, ","))
	}
	return strings.Join(addrs, ",")
}

func isBytes(v any) bool {
	switch v.(type) {
	case []byte, *[]byte:
		return true
	}
	return false
}

func isBytesPtr(v any) bool { _, ok := v.(*[]byte); return ok }

// chainClient folds interceptors around invoke, the first outermost.
func chainClient(is []UnaryClientInterceptor, invoke UnaryInvoker) UnaryInvoker {
	next := invoke
	for i := len(is) - 1; i >= 0; i-- {
		ic, n := is[i], next
		next = func(ctx context.Context, method string, req, reply any, opts ...CallOption) error {
			return ic(ctx, method, req, reply, n, opts...)
		}
	}
	return next
}

// Stats returns the client transport's counters.
func (c *Client) Stats() transport.Stats { return c.tr.Stats() }
