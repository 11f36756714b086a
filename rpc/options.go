package rpc

import (
	"log/slog"
	"time"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/credentials"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// CallOption configures one call (see Header, Trailer and WaitForReady). A handler sends
// metadata back with SetHeader (ahead of a stream's messages) and SetTrailer (at the end).
type CallOption interface {
	apply(*callInfo)
}

// callInfo is what call options set.
type callInfo struct {
	trailer      *MD
	header       *MD
	waitForReady bool
}

// The options are concrete types applied with a type switch, so that a call's callInfo
// stays on its stack.
type trailerOption struct{ md *MD }
type waitForReadyOption struct{}
type headerOption struct{ md *MD }

func (o trailerOption) apply(ci *callInfo)    { ci.trailer = o.md }
func (waitForReadyOption) apply(ci *callInfo) { ci.waitForReady = true }
func (o headerOption) apply(ci *callInfo)     { ci.header = o.md }

func applyOptions(ci *callInfo, opts []CallOption) {
	for _, o := range opts {
		switch o := o.(type) {
		case trailerOption:
			ci.trailer = o.md
		case waitForReadyOption:
			ci.waitForReady = true
		case headerOption:
			ci.header = o.md
		}
	}
}

// Header stores the response headers the handler set (SetHeader, SendHeader) into *md,
// for unary calls and streams (at their end; ClientStream.Header has them sooner).
func Header(md *MD) CallOption { return headerOption{md} }

// Trailer stores the metadata the handler set with SetTrailer into *md.
func Trailer(md *MD) CallOption { return trailerOption{md} }

// WaitForReady makes a call wait (until its context ends) for a connection when none is
// up, instead of failing at once with Unavailable.
func WaitForReady() CallOption { return waitForReadyOption{} }

// common are the options servers and clients share.
type common struct {
	codec     codec.Codec
	device    verbs.Device
	transport transport.Config
	logger    *slog.Logger
	telemetry telemetryConfig
	creds     credentials.TransportCredentials
}

// ServerOption configures a Server.
type ServerOption interface {
	applyServer(*serverOptions)
}

// DialOption configures a Client.
type DialOption interface {
	applyDial(*dialOptions)
}

// Option configures a Server or a Client alike: it is both a ServerOption and a
// DialOption. What both sides have (codec, device, transport, logger, credentials,
// telemetry) is set with an Option; what only one side has with a ServerOption or a
// DialOption.
type Option interface {
	ServerOption
	DialOption
}

type serverOption func(*serverOptions)

func (f serverOption) applyServer(o *serverOptions) { f(o) }

type dialOption func(*dialOptions)

func (f dialOption) applyDial(o *dialOptions) { f(o) }

// commonOption applies to what servers and clients share.
type commonOption func(*common)

func (f commonOption) applyServer(o *serverOptions) { f(&o.common) }
func (f commonOption) applyDial(o *dialOptions)     { f(&o.common) }

type serverOptions struct {
	common
	interceptors      []UnaryServerInterceptor
	streamInterceptor StreamServerInterceptor
	keepalive         *transport.ServerKeepalive // WithKeepalivePolicy
}

type dialOptions struct {
	common
	interceptors       []UnaryClientInterceptor
	streamInterceptors []StreamClientInterceptor
	balancer           Balancer
	keepaliveTime      time.Duration
	keepaliveTimeout   time.Duration
	keepaliveSet       bool
	backoffBase        time.Duration
	backoffMax         time.Duration
	resolver           Resolver
	dnsLookup          DNSLookup
	resolveInterval    time.Duration
	resolveMin         time.Duration
	healthCheck        bool   // WithHealthCheck
	healthService      string // the service it watches
	lanes              int    // WithLanes; 0: adaptive
	lendResponses      bool   // WithLentResponses
}

// Balancer chooses which endpoint a client call goes to.
type Balancer uint8

// Balancers.
const (
	RoundRobin       Balancer = iota // endpoints in turn
	LeastOutstanding                 // the endpoint with the fewest calls in flight
)

// WithTransportCredentials secures every connection of a server or client with creds
// (credentials.NewTLS: TLS 1.3, optionally mutual) before anything else crosses it;
// both sides must use them. Handlers see what the handshake established about the caller
// with PeerFromContext. It overrides the Credentials of WithTransport/WithClientTransport.
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return commonOption(func(c *common) { c.creds = creds })
}

// WithCodec sets the codec (msgpack by default): on a server, of the methods that do not
// name one; on a client, of its calls. Both sides must use the same.
func WithCodec(c codec.Codec) Option {
	return commonOption(func(o *common) { o.codec = c })
}

// WithClientCodec is WithCodec.
//
// Deprecated: use WithCodec, which applies to clients and servers alike.
func WithClientCodec(c codec.Codec) DialOption { return WithCodec(c) }

// WithDevice serves or dials on an RDMA device instead of a soft TCP-fabric device of the
// server's or client's own. The device stays the caller's.
func WithDevice(d verbs.Device) Option {
	return commonOption(func(o *common) { o.device = d })
}

// WithClientDevice is WithDevice.
//
// Deprecated: use WithDevice, which applies to clients and servers alike.
func WithClientDevice(d verbs.Device) DialOption { return WithDevice(d) }

// WithTransport tunes the transport of a server or client: slot sizes, credits, pollers,
// and on a server the handler pool (Config.Handlers bounds concurrent handlers; beyond it
// calls get ResourceExhausted).
func WithTransport(c transport.Config) Option {
	return commonOption(func(o *common) { o.transport = c })
}

// WithClientTransport is WithTransport.
//
// Deprecated: use WithTransport, which applies to clients and servers alike.
func WithClientTransport(c transport.Config) DialOption { return WithTransport(c) }

// WithUnaryInterceptor adds a server interceptor; several run in the order given.
func WithUnaryInterceptor(i UnaryServerInterceptor) ServerOption {
	return serverOption(func(o *serverOptions) { o.interceptors = append(o.interceptors, i) })
}

// WithClientStreamInterceptor adds a client interceptor around every stream the client
// opens (NewStream, and so every generated streaming method); several run in the order
// given. Unary calls go through WithClientInterceptor's.
func WithClientStreamInterceptor(i StreamClientInterceptor) DialOption {
	return dialOption(func(o *dialOptions) { o.streamInterceptors = append(o.streamInterceptors, i) })
}

// WithClientInterceptor adds a client interceptor; several run in the order given.
func WithClientInterceptor(i UnaryClientInterceptor) DialOption {
	return dialOption(func(o *dialOptions) { o.interceptors = append(o.interceptors, i) })
}

// WithLogger sets where a server or client logs what it cannot return to a caller: on a
// server, a failed response or connection; on a client, a failed name resolution (the
// client keeps its addresses) and a change of addresses.
func WithLogger(l *slog.Logger) Option {
	return commonOption(func(o *common) { o.logger = l })
}

// WithBalancer chooses how calls spread over a client's endpoints.
func WithBalancer(b Balancer) DialOption { return dialOption(func(o *dialOptions) { o.balancer = b }) }

// WithKeepalive pings a connection that has answered nothing for interval, and drops it
// (to reconnect) when a ping gets no answer within timeout: a peer that hangs without
// closing anything is noticed. It is off by default, as in gRPC (a dead or vanished peer
// host is noticed by TCP keepalive: transport.Config.PeerTimeout). A server allows a
// ping every 5 minutes while calls are in flight and every 2 hours without, unless its
// policy (WithKeepalivePolicy) allows more; a client that pings more often is sent
// GOAWAY saying "too many pings", and then pings half as often, with a log line.
func WithKeepalive(interval, timeout time.Duration) DialOption {
	return dialOption(func(o *dialOptions) { o.keepaliveTime, o.keepaliveTimeout, o.keepaliveSet = interval, timeout, true })
}

// WithBackoff sets the reconnection backoff: it starts at base and doubles up to max, with
// jitter. The default is 50ms to 2s.
func WithBackoff(base, max time.Duration) DialOption {
	return dialOption(func(o *dialOptions) { o.backoffBase, o.backoffMax = base, max })
}

// WithResolver makes the client take its addresses from r instead of reading them from
// the target, which is then only a name (in errors, logs and telemetry). See Resolver.
func WithResolver(r Resolver) DialOption {
	return dialOption(func(o *dialOptions) { o.resolver = r })
}

// WithDNSLookup sets what resolves dns:/// targets (net.DefaultResolver by default): a
// *net.Resolver of one's own, or a fake in tests. A target that names its DNS server
// (dns://server/name) asks that server instead.
func WithDNSLookup(l DNSLookup) DialOption {
	return dialOption(func(o *dialOptions) { o.dnsLookup = l })
}

// WithResolveInterval sets how often a resolved target (dns:///, WithResolver) is resolved
// again, and the least time between two resolutions: a failed connection or dial asks for
// one at once, but waits for minInterval after the last. Zero or less keeps a default: 30s
// and 5s; minInterval is at most interval.
func WithResolveInterval(interval, minInterval time.Duration) DialOption {
	return dialOption(func(o *dialOptions) { o.resolveInterval, o.resolveMin = interval, minInterval })
}

// WithHealthCheck makes the client watch the health of service ("" for the whole server)
// on each connection, with the health service's Watch (package rpc/health,
// grpc.health.v1.Health), and send calls only to endpoints whose last status on their
// current connection was SERVING: a new connection takes calls from its first SERVING on,
// and one that reports NOT_SERVING (or anything else) takes none until it reports SERVING
// again. A server without the health service (Unimplemented) counts as healthy, with a
// log line. A watch that fails while its connection is up makes the endpoint unhealthy
// and is retried with the reconnection backoff. When no endpoint is healthy, calls fail
// with Unavailable saying so, or wait with WaitForReady, and Dial waits for one. Each
// watch holds one of the server's handlers (transport.Config.Handlers) while it lasts.
func WithHealthCheck(service string) DialOption {
	return dialOption(func(o *dialOptions) { o.healthCheck, o.healthService = true, service })
}

// WithClientLogger is WithLogger.
//
// Deprecated: use WithLogger, which applies to clients and servers alike.
func WithClientLogger(l *slog.Logger) DialOption { return WithLogger(l) }

// WithLanes pins the number of connections (lanes) a client keeps to each endpoint; calls
// and streams take the endpoint's first connection while the endpoint has at most two
// in flight, and a lane drawn at random beyond that, so that under a light load the
// other lanes idle and their readers sleep. Without it a client starts with one and
// opens another while its calls in flight pass two per lane, up to GOMAXPROCS lanes: on
// many cores one connection's reader and socket are the queue every call waits in. Over
// the shm fabric (shm:// targets), where each lane more adds a polling reader on each
// side, calls in flight open lanes up to half of GOMAXPROCS, and the bytes the calls
// carry open another while they pass 4 MiB per lane (large copies side by side). Each
// lane is a connection to the server's limits (MaxConnsPerHost) and counters; balancing,
// health checks, keepalive and GOAWAY stay per endpoint. n below 1 means adaptive.
func WithLanes(n int) DialOption {
	return dialOption(func(o *dialOptions) { o.lanes = max(n, 0) })
}

// WithLentResponses makes the []byte response of a method on []byte both ways the
// client's registered memory itself, lent to the caller, instead of a copy: no allocation
// and no copy per call, whatever the size. Each lent response must be given back with
// Client.Release once the caller is done with it, and neither it nor a slice of it used
// afterwards. Until then it holds memory of the client's connection: the buffer a large
// response was read into, or a receive slot (copied out by the transport once lent
// responses fill half of the connection's receive slots, or its shared receive queue is
// crowded), so keep it briefly. An empty response lends nothing.
// Without this option (the default) every response is the caller's own copy.
func WithLentResponses() DialOption {
	return dialOption(func(o *dialOptions) { o.lendResponses = true })
}

// WithKeepalivePolicy sets a server's keepalive policy, with gRPC's semantics and
// defaults (keepalive.ServerParameters' MaxConnectionAge and MaxConnectionAgeGrace,
// keepalive.EnforcementPolicy's MinTime and PermitWithoutStream): see
// transport.ServerKeepalive. A client that pings more often than it allows is sent
// GOAWAY saying "too many pings" and its connection is closed. It overrides the Keepalive
// of WithTransport.
func WithKeepalivePolicy(p transport.ServerKeepalive) ServerOption {
	return serverOption(func(o *serverOptions) { o.keepalive = &p })
}
