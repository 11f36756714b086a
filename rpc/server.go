package rpc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/internal/clock"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// Server serves registered services over mwrpc transports.
type Server struct {
	opts         serverOptions
	interceptor  UnaryServerInterceptor
	tel          *telemetry    // nil: off
	inlineBudget time.Duration // a run shorter than this counts toward running a method inline; <= 0: off

	mu        sync.Mutex
	methods   map[string]*method
	services  []*ServiceDesc // as registered (ServiceInfo)
	tr        *transport.Transport
	ownDev    verbs.Device // opened by the server, closed by Stop
	listeners map[net.Listener]struct{}
	stopped   bool
}

type method struct {
	full     string
	desc     *MethodDesc // a unary method's, or nil
	stream   *StreamDesc // a streaming method's, or nil
	impl     any
	codec    codec.Codec
	respHint atomic.Int64 // size of recent responses: where to encode the next one
	// short counts the method's latest runs in a row that took less than the inline
	// budget, up to inlineRuns: at inlineRuns the transport may run it inline (InlineOK).
	short atomic.Int32
}

// inlineRuns is how many short runs in a row make a method run inline.
const inlineRuns = 64

// ran records how long a run of m's handler took.
func (m *method) ran(d, budget time.Duration) {
	if d >= budget {
		if m.short.Load() != 0 {
			m.short.Store(0)
		}
	} else if m.short.Load() < inlineRuns {
		m.short.Add(1)
	}
}

// transportHandler is what the server gives its transport: the handler, and its advice on
// what may run inline (transport.InlineAdvisor).
type transportHandler struct{ s *Server }

func (h transportHandler) Serve(ctx context.Context, req []byte, w *transport.ResponseWriter) {
	h.s.handle(ctx, req, w)
}

// InlineOK: a unary method whose latest runs were all shorter than the inline budget
// (transport.Config.InlineBudget) may run where its request was reaped.
func (h transportHandler) InlineOK(req []byte) bool {
	s := h.s
	if s.inlineBudget <= 0 || len(req) < reqFixed {
		return false
	}
	ml := int(binary.LittleEndian.Uint16(req[2:]))
	if ml > len(req)-reqFixed {
		return false
	}
	m := s.methods[string(req[reqFixed:reqFixed+ml])]
	return m != nil && m.desc != nil && m.short.Load() >= inlineRuns
}

// NewServer returns a server with no services.
func NewServer(opts ...ServerOption) *Server {
	s := &Server{methods: make(map[string]*method), listeners: make(map[net.Listener]struct{})}
	for _, o := range opts {
		o.applyServer(&s.opts)
	}
	if s.opts.codec == nil {
		s.opts.codec = codec.Msgpack{}
	}
	if s.opts.logger == nil {
		s.opts.logger = slog.Default()
	}
	s.interceptor = chainServer(s.opts.interceptors)
	if s.inlineBudget = s.opts.transport.InlineBudget; s.inlineBudget == 0 {
		s.inlineBudget = transport.DefaultInlineBudget
	}
	s.tel = newTelemetry(s.opts.telemetry, true)
	return s
}

// RegisterService registers impl as the service sd describes. It panics, as a
// registration mistake is a programming error, if impl does not implement sd.HandlerType,
// a method is registered twice, or the server is already serving.
func (s *Server) RegisterService(sd *ServiceDesc, impl any) {
	if sd.HandlerType != nil {
		want := reflect.TypeOf(sd.HandlerType).Elem()
		if !reflect.TypeOf(impl).Implements(want) {
			panic(fmt.Sprintf("mwrpc: RegisterService(%s): %T does not implement %v", sd.ServiceName, impl, want))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tr != nil {
		panic(fmt.Sprintf("mwrpc: RegisterService(%s) after Serve", sd.ServiceName))
	}
	for _, m := range s.methods {
		if strings.HasPrefix(m.full, "/"+sd.ServiceName+"/") {
			panic(fmt.Sprintf("mwrpc: RegisterService(%s): a service of that name is already registered (%T); two packages of one name declare the same <package>.<Interface>: give one a wire name with a //mwrpc:service line (see docs/evolution.md)",
				sd.ServiceName, m.impl))
		}
	}
	s.services = append(s.services, sd)
	for i := range sd.Methods {
		md := &sd.Methods[i]
		full := "/" + sd.ServiceName + "/" + md.MethodName
		if _, dup := s.methods[full]; dup {
			panic(fmt.Sprintf("mwrpc: method %s registered twice", full))
		}
		m := &method{full: full, desc: md, impl: impl, codec: md.Codec}
		if m.codec == nil {
			m.codec = s.opts.codec
		}
		m.respHint.Store(256)
		s.methods[full] = m
	}
	for i := range sd.Streams {
		sdesc := &sd.Streams[i]
		full := "/" + sd.ServiceName + "/" + sdesc.StreamName
		if _, dup := s.methods[full]; dup {
			panic(fmt.Sprintf("mwrpc: method %s registered twice", full))
		}
		m := &method{full: full, stream: sdesc, impl: impl, codec: sdesc.Codec}
		if m.codec == nil {
			m.codec = s.opts.codec
		}
		s.methods[full] = m
	}
}

// Serve accepts connections on ln and serves them until Stop or GracefulStop; it returns
// nil then, else the listener's error. Several listeners may be served at once.
func (s *Server) Serve(ln net.Listener) error {
	tr, err := s.transport()
	if err != nil {
		_ = ln.Close()
		if errors.Is(err, ErrUnavailable) {
			return nil // stopped before serving
		}
		return err
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	if len(s.listeners) == 0 {
		s.tel.setPeer(ln.Addr().String())
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	err = tr.Serve(ln)
	s.mu.Lock()
	delete(s.listeners, ln)
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return nil
	}
	return err
}

// ListenAndServe listens on address and serves it: a TCP "host:port", or
// "shm:///path/to.sock" for clients on the same host (the shm fabric: a Unix socket at
// that path, which must not exist, and shared-memory rings; removed when the server stops).
func (s *Server) ListenAndServe(address string) error {
	ln, err := s.Listen(address)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Listen opens the listener ListenAndServe would serve address on, for Serve: for a
// caller that needs its address first (a TCP port 0). Its Addr is what clients dial:
// "host:port", or "shm:///path/to.sock".
func (s *Server) Listen(address string) (net.Listener, error) {
	if path, ok := shm.ParseTarget(address); ok {
		return shm.Listen(path, s.opts.transport.SHM())
	}
	return net.Listen("tcp", address)
}

func (s *Server) transport() (*transport.Transport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tr != nil {
		return s.tr, nil
	}
	if s.stopped {
		return nil, Errorf(Unavailable, "mwrpc: server stopped")
	}
	dev := s.opts.device
	if dev == nil {
		d, err := soft.OpenTCP("mwrpc-server")
		if err != nil {
			return nil, err
		}
		dev, s.ownDev = d, d
	}
	cfg := s.opts.transport
	if s.opts.creds != nil {
		cfg.Credentials = s.opts.creds
	}
	if cfg.Logger == nil {
		cfg.Logger = s.opts.logger
	}
	if s.opts.keepalive != nil {
		cfg.Keepalive = *s.opts.keepalive
	}
	tr, err := transport.New(dev, transportHandler{s}, cfg)
	if err != nil {
		if s.ownDev != nil {
			_ = s.ownDev.Close()
			s.ownDev = nil
		}
		return nil, err
	}
	s.tr = tr
	s.tel.observeTransport(tr)
	return tr, nil
}

// Stop closes the listeners and every connection at once: calls in flight fail with
// Unavailable at their callers. It waits for running handlers (their contexts canceled).
func (s *Server) Stop() {
	s.stop(nil)
}

// GracefulStop stops accepting connections, tells every client to send no new calls
// (GOAWAY), waits for the calls in flight to complete and for the clients to close their
// connections once they have their responses (5 s at most), then stops.
func (s *Server) GracefulStop() {
	s.stop(func(tr *transport.Transport) {
		// A live peer that returns no credits must not hold GOAWAY up forever.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tr.GoAway(ctx)
		_ = tr.WaitIdle(context.Background())
		// A handler that returned has queued its response, which may still be on its way:
		// closing now would flush it. A client closes a connection that was sent GOAWAY
		// once its calls on it have their answers.
		for tr.Stats().Conns > 0 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	})
}

func (s *Server) stop(drain func(*transport.Transport)) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	for ln := range s.listeners {
		_ = ln.Close()
	}
	tr, dev := s.tr, s.ownDev
	s.mu.Unlock()
	if tr == nil {
		return
	}
	if drain != nil {
		drain(tr)
	}
	s.tel.stopObserving()
	if err := tr.Close(); err != nil {
		s.opts.logger.Warn("mwrpc: server close", "err", err)
	}
	if dev != nil {
		_ = dev.Close()
	}
}

// streamKey finds the call's serverStream in a handler's context.
type streamKey struct{}

// serverStream is one call being served: pooled, and the handler's context. It is valid
// until the handler returns.
type serverStream struct {
	inner      context.Context
	values     context.Context // inner with the telemetry's span, or nil
	w          *transport.ResponseWriter
	method     *method
	req        []byte // the request message, envelope and body (whose memory writeBytes may reuse)
	body       []byte
	md         []byte
	nmd        int
	inMD       MD
	header     MD     // SetHeader's
	hdrSent    bool   // SendHeader, or a stream's first message, sent it: no more changes
	errDetails []byte // a failed status's encoded details, while writeStatus writes it
	trailer    MD
	dec        func(any) error // bound once to decode
	scratch    []byte
	code       Code   // the status written
	errMsg     string // and its message, for a failure
	respLen    int    // the response payload's length
	tel        callSpan
	carrier    mdExtractor
	derived    atomic.Bool   // AfterFunc was called: a derived context may use it after the call
	ss         *ServerStream // a streaming call's, for StreamBuffer
}

var streamPool = sync.Pool{New: func() any {
	st := &serverStream{}
	st.dec = st.decode
	return st
}}

func (st *serverStream) decode(v any) error {
	if err := st.method.codec.Unmarshal(st.body, v); err != nil {
		return &Status{Code: InvalidArgument, Message: err.Error(), cause: err}
	}
	return nil
}

// Deadline, Done and Err are the transport call context's, bounded by the caller's deadline.
func (st *serverStream) Deadline() (time.Time, bool) { return st.inner.Deadline() }
func (st *serverStream) Done() <-chan struct{}       { return st.inner.Done() }
func (st *serverStream) Err() error                  { return st.inner.Err() }

// Value returns the stream for streamKey, else the telemetry's (the span, the caller's
// baggage), else the parent's values.
func (st *serverStream) Value(k any) any {
	if k == (streamKey{}) {
		return st
	}
	if st.values != nil {
		return st.values.Value(k)
	}
	return st.inner.Value(k)
}

type afterFuncer interface {
	AfterFunc(func()) func() bool
}

// AfterFunc lets derived contexts follow cancellation without a goroutine each.
func (st *serverStream) AfterFunc(f func()) func() bool {
	st.derived.Store(true)
	if a, ok := st.inner.(afterFuncer); ok {
		return a.AfterFunc(f)
	}
	return context.AfterFunc(st.inner, f)
}

// handle serves one transport request.
func (s *Server) handle(ctx context.Context, req []byte, w *transport.ResponseWriter) {
	var r request
	if err := parseRequest(req, &r); err != nil {
		s.writeError(w, nil, InvalidArgument, err.Error())
		return
	}
	m := s.methods[string(r.method)]
	if m != nil && (m.stream != nil) != (w.Stream() != nil) {
		how := "a streaming method: open a stream (Client.NewStream)"
		if m.stream == nil {
			how = "a unary method: call it with Invoke"
		}
		s.writeError(w, nil, Unimplemented, fmt.Sprintf("method %s is %s", m.full, how))
		return
	}
	if m != nil && m.stream != nil {
		s.handleStream(ctx, &r, m, w)
		return
	}
	if m == nil {
		msg := "unknown method " + string(r.method)
		var cs callSpan
		var x mdExtractor
		tctx := s.tel.startServer(ctx, "_OTHER", r.md, r.nmd, &cs, &x)
		if cs.span != nil && cs.span.IsRecording() { // the convention's name for a method not known
			cs.span.SetAttributes(attribute.String("rpc.method_original", spanName(string(r.method))))
		}
		s.writeError(w, nil, Unimplemented, msg)
		s.tel.end(tctx, &cs, Unimplemented, msg)
		return
	}
	st := streamPool.Get().(*serverStream)
	if cancel := s.begin(st, ctx, &r, m, w); cancel != nil {
		defer cancel()
	}
	s.tel.spanTransfer(&st.tel, AttrRequestSize, AttrRequestTransfer, len(req), w.RequestWindowed())
	var start int64
	if s.inlineBudget > 0 {
		start = clock.Nanos()
	}
	if bh := m.desc.BytesHandler; bh != nil && s.interceptor == nil {
		out, err := s.invokeBytes(st, m, bh)
		if s.inlineBudget > 0 {
			m.ran(time.Duration(clock.Nanos()-start), s.inlineBudget)
		}
		if err != nil {
			status := handlerStatus(err, r.deadline)
			s.writeStatus(w, st, status)
		} else {
			s.writeBytes(w, st, out)
		}
	} else if resp, err := s.invoke(st, m); err != nil {
		if s.inlineBudget > 0 {
			m.ran(time.Duration(clock.Nanos()-start), s.inlineBudget)
		}
		status := handlerStatus(err, r.deadline)
		s.writeStatus(w, st, status)
	} else {
		if s.inlineBudget > 0 {
			m.ran(time.Duration(clock.Nanos()-start), s.inlineBudget)
		}
		s.writeResponse(w, st, m, resp)
	}
	s.endServerSpan(st, w)
	if st.derived.Load() {
		return // a derived context may still call into it: not reused
	}
	st.inner, st.values, st.method, st.req, st.body, st.md, st.inMD, st.trailer, st.w = nil, nil, nil, nil, nil, nil, nil, nil, nil
	st.header, st.hdrSent = nil, false
	st.tel, st.carrier, st.errMsg = callSpan{}, mdExtractor{}, ""
	streamPool.Put(st)
}

// begin readies st for the call r makes to m: its context (bounded by the caller's
// deadline; the returned cancel, if not nil, ends that bound) and the telemetry's span.
func (s *Server) begin(st *serverStream, ctx context.Context, r *request, m *method, w *transport.ResponseWriter) (cancel context.CancelFunc) {
	st.inner, st.method, st.req, st.body, st.md, st.nmd, st.w = ctx, m, r.whole, r.body, r.md, r.nmd, w
	if r.deadline != 0 {
		st.inner, cancel = transport.WithCallDeadline(ctx, time.Unix(0, r.deadline))
	}
	if v := s.tel.startServer(st.inner, m.full, r.md, r.nmd, &st.tel, &st.carrier); v != st.inner {
		st.values = v
	}
	return cancel
}

// endServerSpan finishes the call's span and duration metric with what was written.
func (s *Server) endServerSpan(st *serverStream, w *transport.ResponseWriter) {
	s.tel.spanTransfer(&st.tel, AttrResponseSize, AttrResponseTransfer, st.respLen, st.respLen > w.EagerLimit())
	msg := ""
	if st.code != OK {
		msg = st.errMsg
	}
	s.tel.end(st, &st.tel, st.code, msg)
}

// handlerStatus is the status of a handler's error. A handler whose context was canceled
// by the caller at or after the call's deadline answers DeadlineExceeded: the caller
// canceled because its deadline passed, which may reach the handler before the
// handler's own timer fires; both sides then report the same event.
func handlerStatus(err error, deadline int64) *Status {
	st := StatusOf(err)
	if st.Code == Canceled && deadline != 0 && time.Now().UnixNano() >= deadline {
		return &Status{Code: DeadlineExceeded, Message: "deadline exceeded (the caller canceled at its deadline)", cause: err}
	}
	return st
}

// invoke runs the method; a panic becomes Internal.
func (s *Server) invoke(st *serverStream, m *method) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			resp, err = nil, Errorf(Internal, "handler %s panicked: %v", m.full, r)
		}
	}()
	return m.desc.Handler(m.impl, st, st.dec, s.interceptor)
}

// invokeBytes runs a raw method's allocation-free handler; a panic becomes Internal.
func (s *Server) invokeBytes(st *serverStream, m *method, bh func(any, context.Context, []byte) ([]byte, error)) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, Errorf(Internal, "handler %s panicked: %v", m.full, r)
		}
	}()
	return bh(m.impl, st, st.body)
}

// writeBytes sends a raw response: the envelope, then the bytes, copied once into the
// send slot (or, an echo of the request, gathered from its receive slot) or, when large,
// into registered memory.
func (s *Server) writeBytes(w *transport.ResponseWriter, st *serverStream, body []byte) {
	env := appendResponse(st.scratch[:0], st.unsentHeader(), st.trailer, "")
	if len(env)+len(body) <= w.EagerLimit() { // inside the SEND, behind the envelope (WriteParts)
		st.scratch = env[:0]
		st.code, st.respLen = OK, len(env)+len(body)
		_ = w.WriteParts(OK, env, body)
		return
	}
	st.scratch = env[:0]
	if off, ok := inRequest(w, st.req, body); ok && off >= len(env) {
		// A body in the request's own memory (an echo, a transform in place) leaves from
		// there: the envelope is written in front of it, over the request's own, which
		// nothing reads any more.
		out := st.req[off-len(env) : off+len(body)]
		copy(out, env)
		st.code, st.respLen = OK, len(out)
		_ = w.Write(OK, out)
		return
	}
	buf, err := w.Buffer(len(env) + len(body))
	if err != nil {
		s.writeError(w, st, ResourceExhausted, err.Error())
		return
	}
	probe.Mark(probe.CopyResp)
	n := copy(buf, env)
	w.CopyIn(buf[n:], body)
	probe.Mark(probe.CopyRespDone)
	st.code, st.respLen = OK, len(buf)
	_ = w.Write(OK, buf)
}

// inRequest reports where body lies in req, the request message, when req is memory of
// its own that the transport can send a response from (a windowed request).
func inRequest(w *transport.ResponseWriter, req, body []byte) (int, bool) {
	if !w.RequestWindowed() || len(body) == 0 || len(req) == 0 {
		return 0, false
	}
	start, at := uintptr(unsafe.Pointer(unsafe.SliceData(req))), uintptr(unsafe.Pointer(unsafe.SliceData(body)))
	if at < start || at-start > uintptr(len(req)) || uintptr(len(body)) > uintptr(len(req))-(at-start) {
		return 0, false
	}
	return int(at - start), true
}

// writeResponse encodes resp behind the envelope. A response expected to be large is
// encoded straight into registered memory, so it leaves without a copy.
func (s *Server) writeResponse(w *transport.ResponseWriter, st *serverStream, m *method, resp any) {
	hint := int(m.respHint.Load())
	var buf []byte
	if hint > w.EagerLimit() { // it will go through a window: no copy if built in place
		if b, err := w.Buffer(hint); err == nil {
			buf = b[:0]
		}
	}
	fromScratch := buf == nil
	if fromScratch {
		buf = st.scratch[:0]
	}
	out := appendResponse(buf, st.unsentHeader(), st.trailer, "")
	out, err := m.codec.Append(out, resp)
	if err != nil {
		s.writeError(w, st, Internal, fmt.Sprintf("encoding the response of %s: %v", m.full, err))
		return
	}
	if n := int64(len(out) + len(out)/8); n > m.respHint.Load() || n < m.respHint.Load()/2 {
		m.respHint.Store(n)
	}
	if fromScratch && cap(out) <= 64<<10 {
		st.scratch = out[:0] // keep a grown scratch buffer for the next call
	}
	st.code, st.respLen = OK, len(out)
	if err := w.Write(OK, out); err != nil {
		s.opts.logger.Debug("mwrpc: response not sent", "method", m.full, "err", err)
	}
}

// writeStatus writes a handler's failed status with its details; details that do not
// encode are left out, with a log line.
func (s *Server) writeStatus(w *transport.ResponseWriter, st *serverStream, status *Status) {
	if len(status.details) > 0 {
		d, err := encodeDetails(status.details)
		if err != nil {
			s.opts.logger.Warn("mwrpc: status details not sent", "method", st.method.full, "err", err)
		}
		st.errDetails = d
	}
	s.writeError(w, st, status.Code, status.Message)
	st.errDetails = nil
}

func (s *Server) writeError(w *transport.ResponseWriter, st *serverStream, c Code, msg string) {
	var header, trailer MD
	var buf, details []byte
	if st != nil {
		header, trailer, buf, details = st.unsentHeader(), st.trailer, st.scratch[:0], st.errDetails
	}
	out := appendResponseDetails(buf, header, trailer, msg, details)
	if st != nil {
		st.code, st.errMsg, st.respLen = c, msg, len(out)
	}
	_ = w.Write(c, out)
}

// chainServer folds interceptors into one, the first outermost.
func chainServer(is []UnaryServerInterceptor) UnaryServerInterceptor {
	switch len(is) {
	case 0:
		return nil
	case 1:
		return is[0]
	}
	return func(ctx context.Context, req any, info *UnaryServerInfo, handler UnaryHandler) (any, error) {
		next := handler
		for i := len(is) - 1; i > 0; i-- {
			inner, h := is[i], next
			next = func(ctx context.Context, req any) (any, error) { return inner(ctx, req, info, h) }
		}
		return is[0](ctx, req, info, next)
	}
}

// Stats returns the server transport's counters (zero before Serve).
func (s *Server) Stats() transport.Stats {
	s.mu.Lock()
	tr := s.tr
	s.mu.Unlock()
	if tr == nil {
		return transport.Stats{}
	}
	return tr.Stats()
}
