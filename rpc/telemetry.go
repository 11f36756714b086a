package rpc

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/semconv/v1.43.0/rpcconv"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/mwrpc/mwrpc/transport"
)

// OpenTelemetry, in one place. Servers and clients trace and time every call through the
// global providers (otel.GetTracerProvider, GetMeterProvider, GetTextMapPropagator) unless
// options give others; the library imports only the API, so with no SDK installed the
// instrumentation costs a few atomic loads per call and allocates nothing. Spans and the
// duration histograms follow the RPC semantic conventions (semconv v1.43.0); the transport's
// own counters are observable instruments read at collection time. docs/observability.md
// lists every span attribute and instrument.

// ScopeName is the instrumentation scope of mwrpc's tracers and meters.
const ScopeName = "github.com/mwrpc/mwrpc/rpc"

// systemName is rpc.system.name: not one of the convention's well-known values.
const systemName rpcconv.SystemNameAttr = "mwrpc"

// Attribute keys of mwrpc's own span attributes: the sizes of a call's two messages as the
// transport carried them (envelope and body), and how each travelled.
const (
	AttrRequestSize      = attribute.Key("mwrpc.request.size")
	AttrResponseSize     = attribute.Key("mwrpc.response.size")
	AttrRequestTransfer  = attribute.Key("mwrpc.request.transfer")  // "eager" or "window"
	AttrResponseTransfer = attribute.Key("mwrpc.response.transfer") // "eager" or "window"
)

// telemetryConfig is what the telemetry options set; nil providers mean the global ones,
// looked up at each call, so an SDK installed after Dial or NewServer is still used.
type telemetryConfig struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	prop     propagation.TextMapPropagator
	disabled bool
}

// WithTracerProvider traces a server's or client's calls with tp instead of the global
// provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return commonOption(func(c *common) { c.telemetry.tp = tp })
}

// WithMeterProvider records a server's or client's metrics with mp instead of the global
// provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return commonOption(func(c *common) { c.telemetry.mp = mp })
}

// WithPropagators carries trace context and baggage in call metadata with p instead of
// the global propagator (which propagates nothing until the application sets one, for
// example propagation.TraceContext{} and propagation.Baggage{}).
func WithPropagators(p propagation.TextMapPropagator) Option {
	return commonOption(func(c *common) { c.telemetry.prop = p })
}

// WithoutTelemetry turns tracing, metrics and propagation off for a server or client.
func WithoutTelemetry() Option {
	return commonOption(func(c *common) { c.telemetry.disabled = true })
}

// telemetry instruments one Server or Client: the seam between the call path and
// OpenTelemetry, set once when the Server or Client is made. The call path calls its
// methods at fixed points of every call and stream (start, inject, transfer, end) with no
// branches of its own; a nil *telemetry is telemetry off, and each method is then a no-op
// that allocates nothing.
type telemetry struct {
	cfg      telemetryConfig
	server   bool
	kindOpts []trace.SpanStartOption
	tracers  atomic.Pointer[tracerEntry]
	clientH  rpcconv.ClientCallDuration
	serverH  rpcconv.ServerCallDuration
	hist     metric.Float64Histogram // the one of the two in use
	peer     atomic.Pointer[[]attribute.KeyValue]
	attrSets sync.Map // setKey -> []metric.RecordOption
	nsets    atomic.Int32

	regMu sync.Mutex
	reg   metric.Registration
}

// setKey names one cached metric attribute set.
type setKey struct {
	method string
	code   Code
}

// maxAttrSets bounds the cache of attribute sets (a client may call any method name).
const maxAttrSets = 4096

// tracerEntry is the tracer of one provider. Only providers of a comparable type are
// cached (comparing others would panic).
type tracerEntry struct {
	tp     trace.TracerProvider
	typ    reflect.Type
	tracer trace.Tracer
	on     bool
}

func newTelemetry(cfg telemetryConfig, server bool) *telemetry {
	if cfg.disabled {
		return nil
	}
	t := &telemetry{cfg: cfg, server: server}
	kind := trace.SpanKindClient
	if server {
		kind = trace.SpanKindServer
	}
	t.kindOpts = []trace.SpanStartOption{trace.WithSpanKind(kind)}
	meter := t.meterProvider().Meter(ScopeName)
	var err error
	if server {
		t.serverH, err = rpcconv.NewServerCallDuration(meter)
		t.hist = t.serverH.Inst()
	} else {
		t.clientH, err = rpcconv.NewClientCallDuration(meter)
		t.hist = t.clientH.Inst()
	}
	if err != nil {
		otel.Handle(err)
	}
	return t
}

func (t *telemetry) meterProvider() metric.MeterProvider {
	if t.cfg.mp != nil {
		return t.cfg.mp
	}
	return otel.GetMeterProvider()
}

func (t *telemetry) propagator() propagation.TextMapPropagator {
	if t.cfg.prop != nil {
		return t.cfg.prop
	}
	return otel.GetTextMapPropagator()
}

// tracer returns the tracer to use now and whether it records anything at all: the
// global provider before an SDK is installed, and the API's noop provider, do not, and
// are skipped without starting a span (which would allocate).
func (t *telemetry) tracer() (trace.Tracer, bool) {
	tp := t.cfg.tp
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	typ := reflect.TypeOf(tp)
	if e := t.tracers.Load(); e != nil && e.typ == typ && e.tp == tp { // same type: comparable
		return e.tracer, e.on
	}
	e := &tracerEntry{tp: tp, typ: typ, tracer: tp.Tracer(ScopeName), on: !isNoopTracerProvider(tp)}
	if typ.Comparable() {
		t.tracers.Store(e)
	}
	return e.tracer, e.on
}

// isNoopTracerProvider: the API's noop provider, or the global placeholder that no SDK
// has replaced yet (otel.SetTracerProvider replaces what otel.GetTracerProvider returns).
func isNoopTracerProvider(tp trace.TracerProvider) bool {
	if _, ok := tp.(noop.TracerProvider); ok {
		return true
	}
	ty := reflect.TypeOf(tp)
	return ty.Kind() == reflect.Pointer && ty.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// setPeer records server.address and server.port: the target a client dialed (as
// otelgrpc does) or the address a server listens on.
func (t *telemetry) setPeer(hostport string) {
	if t == nil {
		return
	}
	var kv []attribute.KeyValue
	if host, port, err := net.SplitHostPort(hostport); err == nil && !strings.Contains(hostport, ",") {
		kv = append(kv, attribute.String("server.address", host))
		if p, err := strconv.Atoi(port); err == nil {
			kv = append(kv, attribute.Int("server.port", p))
		}
	} else if hostport != "" {
		kv = append(kv, attribute.String("server.address", hostport))
	}
	t.peer.Store(&kv)
	t.attrSets.Range(func(k, _ any) bool { t.attrSets.Delete(k); return true })
	t.nsets.Store(0)
}

func (t *telemetry) peerAttrs() []attribute.KeyValue {
	if p := t.peer.Load(); p != nil {
		return *p
	}
	return nil
}

// callSpan is one call's instrumentation, on the caller's stack.
type callSpan struct {
	span   trace.Span // nil: no span
	start  time.Time  // zero: no metric
	method string     // rpc.method: the full method without its leading slash
}

// spanName is rpc.method and the span name: "Service/Method".
func spanName(full string) string { return strings.TrimPrefix(full, "/") }

// startClient begins a client call: the span (a child of ctx's) and the clock.
func (t *telemetry) startClient(ctx context.Context, full string, cs *callSpan) context.Context {
	if t == nil {
		return ctx
	}
	return t.start(ctx, spanName(full), cs, nil)
}

// start begins a call on either side: the clock, then, after extract (if any) has put the
// caller's trace context in ctx, the span.
func (t *telemetry) start(ctx context.Context, method string, cs *callSpan, extract func(context.Context) context.Context) context.Context {
	cs.method = method
	if t.hist.Enabled(ctx) {
		cs.start = time.Now()
	}
	if extract != nil {
		ctx = extract(ctx)
	}
	tracer, on := t.tracer()
	if !on {
		return ctx
	}
	ctx, cs.span = tracer.Start(ctx, method, t.kindOpts...)
	if cs.span.IsRecording() {
		cs.span.SetAttributes(attribute.String("rpc.system.name", string(systemName)),
			attribute.String("rpc.method", method))
		cs.span.SetAttributes(t.peerAttrs()...)
	}
	return ctx
}

// end finishes a call with its status code and message.
func (t *telemetry) end(ctx context.Context, cs *callSpan, code Code, msg string) {
	if t == nil {
		return
	}
	// The duration is recorded before the span ends: whoever sees the span ended (an
	// exporter, a test waiting for it) sees the call's point in the histogram too.
	if !cs.start.IsZero() {
		t.hist.Record(ctx, time.Since(cs.start).Seconds(), t.recordOptions(cs.method, code)...)
	}
	if s := cs.span; s != nil {
		if s.IsRecording() {
			s.SetAttributes(attribute.String("rpc.response.status_code", statusName(code)))
			if code != OK {
				s.SetAttributes(attribute.String("error.type", statusName(code)))
			}
			if t.spanError(code) {
				s.SetStatus(codes.Error, msg)
			}
		}
		s.End()
	}
}

// endErr finishes a call that returned err.
func (t *telemetry) endErr(ctx context.Context, cs *callSpan, err error) {
	if t == nil {
		return
	}
	if err == nil {
		t.end(ctx, cs, OK, "")
		return
	}
	st := StatusOf(err)
	t.end(ctx, cs, st.Code, st.Message)
}

// spanError says whether a status makes the span an error: every failure on the client;
// on the server, only those that are the server's fault (as the convention says for gRPC).
func (t *telemetry) spanError(code Code) bool {
	if !t.server {
		return code != OK
	}
	switch code {
	case Unknown, DeadlineExceeded, Unimplemented, Internal, Unavailable, DataLoss:
		return true
	}
	return false
}

// recordOptions returns the duration metric's attributes for method and code, cached so
// that recording allocates nothing.
func (t *telemetry) recordOptions(method string, code Code) []metric.RecordOption {
	k := setKey{method, code}
	if v, ok := t.attrSets.Load(k); ok {
		return v.([]metric.RecordOption)
	}
	kv := []attribute.KeyValue{
		attribute.String("rpc.system.name", string(systemName)),
		attribute.String("rpc.method", method),
		attribute.String("rpc.response.status_code", statusName(code)),
	}
	if code != OK {
		kv = append(kv, attribute.String("error.type", statusName(code)))
	}
	kv = append(kv, t.peerAttrs()...)
	opts := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
	if t.nsets.Add(1) <= maxAttrSets {
		t.attrSets.Store(k, opts)
	}
	return opts
}

// transferAttrs are a message's size and how it travelled.
func transferAttrs(sizeKey, transferKey attribute.Key, size int, windowed bool) [2]attribute.KeyValue {
	how := "eager"
	if windowed {
		how = "window"
	}
	return [2]attribute.KeyValue{sizeKey.Int(size), transferKey.String(how)}
}

// transfer puts a message's size and path on ctx's span, when it records.
func (t *telemetry) transfer(ctx context.Context, sizeKey, transferKey attribute.Key, size int, windowed bool) {
	if t == nil {
		return
	}
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		kv := transferAttrs(sizeKey, transferKey, size, windowed)
		s.SetAttributes(kv[:]...)
	}
}

// spanTransfer puts a message's size and path on the call's span, when it records.
func (t *telemetry) spanTransfer(cs *callSpan, sizeKey, transferKey attribute.Key, size int, windowed bool) {
	if t == nil || cs.span == nil || !cs.span.IsRecording() {
		return
	}
	kv := transferAttrs(sizeKey, transferKey, size, windowed)
	cs.span.SetAttributes(kv[:]...)
}

// statusNames are rpc.response.status_code values: gRPC's names for the same codes.
var statusNames = [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func statusName(c Code) string {
	if int(c) < len(statusNames) {
		return statusNames[c]
	}
	return strconv.Itoa(int(c))
}

// inject appends the propagator's fields for ctx (traceparent, tracestate, baggage) to a
// request envelope b as metadata entries, and counts them in its header. md is the
// caller's own metadata, whose keys win.
func (t *telemetry) inject(ctx context.Context, b []byte, md MD) []byte {
	if t == nil {
		return b
	}
	if !trace.SpanContextFromContext(ctx).IsValid() && baggage.FromContext(ctx).Len() == 0 {
		return b
	}
	a := injectorPool.Get().(*mdInjector)
	a.b, a.md, a.n = b, md, int(binary.LittleEndian.Uint16(b[4:]))
	t.propagator().Inject(ctx, a)
	binary.LittleEndian.PutUint16(a.b[4:], uint16(a.n))
	b = a.b
	*a = mdInjector{}
	injectorPool.Put(a)
	return b
}

var injectorPool = sync.Pool{New: func() any { return new(mdInjector) }}

// mdInjector is a propagation.TextMapCarrier that appends metadata entries to a request
// envelope.
type mdInjector struct {
	b  []byte
	md MD
	n  int
}

func (a *mdInjector) Get(string) string { return "" }
func (a *mdInjector) Keys() []string    { return nil }

func (a *mdInjector) Set(k, v string) {
	k = strings.ToLower(k)
	if _, own := a.md[k]; own || a.n >= maxMDEntries || len(k) > maxMDKeyLen {
		return
	}
	a.b = appendMDEntry(a.b, k, v)
	a.n++
}

// mdExtractor is a propagation.TextMapCarrier over a request's checked metadata entries.
type mdExtractor struct {
	b []byte
	n int
}

// Get returns the first value of key (lowercase, as propagators ask).
func (x *mdExtractor) Get(key string) string {
	for k, v := range mdEntries(x.b, x.n) {
		if string(k) == key {
			return string(v)
		}
	}
	return ""
}

// Keys returns every key.
func (x *mdExtractor) Keys() []string {
	keys := make([]string, 0, x.n)
	for k := range mdEntries(x.b, x.n) {
		keys = append(keys, string(k))
	}
	return keys
}

// Set does nothing: the request is read-only.
func (x *mdExtractor) Set(string, string) {}

// startServer begins serving a call: the caller's trace context extracted from the
// request's metadata, the server span, the clock. It returns the context the handler's
// values come from (trace.SpanFromContext on the handler's context finds the span).
func (t *telemetry) startServer(base context.Context, full string, md []byte, nmd int, cs *callSpan, x *mdExtractor) context.Context {
	if t == nil {
		return base
	}
	if nmd == 0 {
		return t.start(base, spanName(full), cs, nil)
	}
	*x = mdExtractor{b: md, n: nmd}
	return t.start(base, spanName(full), cs, func(ctx context.Context) context.Context {
		return t.propagator().Extract(ctx, x)
	})
}

// observeTransport registers the transport's counters as observable instruments, read at
// each collection (nothing on the call path).
func (t *telemetry) observeTransport(tr *transport.Transport) {
	if t == nil {
		return
	}
	side := "client"
	if t.server {
		side = "server"
	}
	m := t.meterProvider().Meter(ScopeName)
	attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("mwrpc.side", side)))
	var errs []error
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		g, err := m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	bound := counter("mwrpc.windows.bound", "{window}", "Large messages exposed through a memory window.")
	revoked := counter("mwrpc.windows.revoked", "{window}", "Windows the peer revoked with SEND_WITH_INV after its READ.")
	reclaimed := counter("mwrpc.windows.reclaimed", "{window}", "Windows revoked by LOCAL_INV because the peer never did (lease expiry, lost peer).")
	eager := counter("mwrpc.eager.bytes", "By", "Payload bytes sent inside SENDs.")
	read := counter("mwrpc.read.bytes", "By", "Payload bytes fetched with RDMA READ.")
	poolUsed := gauge("mwrpc.pool.used", "By", "Registered pool bytes held by buffers in use.")
	poolCap := gauge("mwrpc.pool.capacity", "By", "Registered pool bytes.")
	running := gauge("mwrpc.handlers.running", "{handler}", "Handlers running now.")
	idle := gauge("mwrpc.handlers.idle", "{handler}", "Handlers the pool can still start before calls get RESOURCE_EXHAUSTED.")
	conns := gauge("mwrpc.connections.open", "{connection}", "Connections set up and not yet closed.")
	exposed := gauge("mwrpc.windows.exposed", "{window}", "Windows bound now: memory a peer may still READ.")
	events := counter("mwrpc.peer.events", "{event}", "What peers made happen that an operator should hear of, by mwrpc.event: refused (connection limits), setup_failed, protocol (the peer broke the protocol), access (of those: a bad rkey), stalled, crowded, overloaded, idle_closed, too_many_pings.")
	eventAttrs := func(name string) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String("mwrpc.side", side), attribute.String("mwrpc.event", name)))
	}
	eventNames := [...]string{"refused", "setup_failed", "protocol", "access", "stalled", "crowded", "overloaded", "idle_closed", "too_many_pings"}
	var eventSets [len(eventNames)]metric.MeasurementOption
	for i, n := range eventNames {
		eventSets[i] = eventAttrs(n)
	}
	if err := errors.Join(errs...); err != nil {
		otel.Handle(err)
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := tr.Stats()
		var used int64
		for _, c := range st.Pool.Classes {
			used += c.BytesInUse
		}
		o.ObserveInt64(bound, int64(st.WindowsBound), attrs)
		o.ObserveInt64(revoked, int64(st.RevokedPeer), attrs)
		o.ObserveInt64(reclaimed, int64(st.Reclaimed), attrs)
		o.ObserveInt64(eager, int64(st.EagerBytes), attrs)
		o.ObserveInt64(read, int64(st.ReadBytes), attrs)
		o.ObserveInt64(poolUsed, used, attrs)
		o.ObserveInt64(poolCap, st.Pool.RegisteredBytes, attrs)
		o.ObserveInt64(running, int64(st.Handlers), attrs)
		o.ObserveInt64(idle, int64(st.HandlersCap-st.Handlers), attrs)
		o.ObserveInt64(conns, int64(st.Conns), attrs)
		o.ObserveInt64(exposed, int64(st.WindowsExposed), attrs)
		for i, n := range [len(eventNames)]uint64{st.Refused, st.SetupFailed, st.Protocol, st.Access, st.Stalled, st.Crowded, st.Overloaded, st.IdleClosed, st.TooManyPings} {
			o.ObserveInt64(events, int64(n), eventSets[i])
		}
		return nil
	}, bound, revoked, reclaimed, eager, read, poolUsed, poolCap, running, idle, conns, exposed, events)
	if err != nil {
		otel.Handle(err)
		return
	}
	t.regMu.Lock()
	t.reg = reg
	t.regMu.Unlock()
}

// stopObserving unregisters the transport's instruments (at Close or Stop).
func (t *telemetry) stopObserving() {
	if t == nil {
		return
	}
	t.regMu.Lock()
	reg := t.reg
	t.reg = nil
	t.regMu.Unlock()
	if reg != nil {
		if err := reg.Unregister(); err != nil {
			otel.Handle(err)
		}
	}
}
