package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport"
)

// Streams. A streaming method's call opens a transport stream (transport.Stream): its
// first message is the request envelope (method, deadline, metadata) with, for a
// server-streaming method, the request; then messages flow both ways, each one codec
// body with no envelope; the server's response ends it with the status, the trailer and,
// for a client-streaming method, the reply. A message whose Go type is []byte travels as
// it is on both sides (never encoded); any other with the codec.
//
// Generated code shows streams as iterators (ServerStreamCall, ClientStreamCall,
// BidiStreamCall, RecvAll, SendAll); ClientStream and ServerStream are the Send/Recv view
// under them, for code that wants it.

// StreamDesc describes a streaming method.
type StreamDesc struct {
	StreamName string
	Handler    StreamHandler
	// ClientStreams and ServerStreams say who sends a stream of messages: the caller
	// (client streaming), the server (server streaming), or both (bidirectional).
	ClientStreams, ServerStreams bool
	// Codec encodes messages other than []byte; nil means the server's.
	Codec codec.Codec
}

// StreamHandler serves one streaming call. reply, when not nil, is sent as the final
// message with the OK status (a client-streaming method's reply); an error ends the
// stream with its status.
type StreamHandler func(srv any, stream *ServerStream) (reply any, err error)

// StreamServerInfo describes a streaming call to stream interceptors.
type StreamServerInfo struct {
	Server                       any    // the implementation
	FullMethod                   string // "/files.Files/Download"
	ClientStreams, ServerStreams bool
}

// StreamServerInterceptor wraps every streaming call a server runs, as
// UnaryServerInterceptor does unary ones (WithStreamInterceptor).
type StreamServerInterceptor func(srv any, stream *ServerStream, info *StreamServerInfo, handler StreamHandler) (any, error)

// StreamInvoker opens streams; *Client implements it.
type StreamInvoker interface {
	NewStream(ctx context.Context, method string, req any, opts ...CallOption) (*ClientStream, error)
}

// msgEvent records one message on a stream's span (the rpc.message event of the OpenTelemetry
// RPC conventions).
func msgEvent(span trace.Span, sent bool, id, size int) {
	if span == nil || !span.IsRecording() {
		return
	}
	typ := "RECEIVED"
	if sent {
		typ = "SENT"
	}
	span.AddEvent("rpc.message", trace.WithAttributes(attribute.String("rpc.message.type", typ),
		attribute.Int("rpc.message.id", id), attribute.Int("rpc.message.uncompressed_size", size)))
}

// encodeMsg encodes v behind b: []byte as it is, anything else with cod.
func encodeMsg(cod codec.Codec, b []byte, v any) ([]byte, error) {
	switch p := v.(type) {
	case []byte:
		return append(b, p...), nil
	case *[]byte:
		return append(b, *p...), nil
	}
	return cod.Append(b, v)
}

// decodeMsg decodes p into v: a *[]byte gets a copy, anything else goes through cod.
func decodeMsg(cod codec.Codec, p []byte, v any) error {
	if b, ok := v.(*[]byte); ok {
		*b = bytes.Clone(p)
		return nil
	}
	return cod.Unmarshal(p, v)
}

// sendMsg sends v on ts: encoded straight into registered memory when the codec knows it
// is above the eager threshold (no copy between the codec and the NIC), else through
// scratch.
func sendMsg(ctx context.Context, ts *transport.Stream, tr *transport.Transport, cod codec.Codec, scratch *[]byte, v any) (int, error) {
	if b, ok := v.([]byte); ok {
		return len(b), ts.Send(ctx, b)
	}
	if sz, ok := cod.(codec.Sizer); ok {
		if n, known := sz.Size(v); known && n > ts.EagerLimit() && n <= ts.MaxSend() {
			buf, err := tr.Pool().Get(ctx, n)
			if err != nil {
				return 0, &Status{Code: ResourceExhausted, Message: fmt.Sprintf("mwrpc: stream message buffer: %v", err), cause: err}
			}
			b, err := cod.Append(buf.Bytes()[:0], v)
			if err == nil && len(b) <= buf.Cap() {
				buf.SetLen(len(b))
				return len(b), ts.SendBuf(ctx, buf)
			}
			buf.Release()
			if err != nil {
				return 0, &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: encoding a stream message: %v", err), cause: err}
			}
		}
	}
	b, err := encodeMsg(cod, (*scratch)[:0], v)
	if err != nil {
		return 0, &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: encoding a stream message: %v", err), cause: err}
	}
	if cap(b) <= 64<<10 {
		*scratch = b[:0]
	}
	return len(b), ts.Send(ctx, b)
}

// streamErr turns a transport stream's error into the call's status; io.EOF stays as it is.
func streamErr(ctx context.Context, err error) error {
	if err == io.EOF {
		return err
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return StatusOf(ctx.Err())
	}
	return StatusOf(err)
}

// ClientStream is the caller's side of a streaming call (Client.NewStream). One goroutine
// may send while another receives. The stream ends when RecvMsg returns io.EOF (the OK
// end) or an error; reading to the end, canceling the context or Close releases it.
type ClientStream struct {
	c      *Client
	ep     *endpoint
	ts     *transport.Stream
	ctx    context.Context
	method string
	cod    codec.Codec

	// The sending side's.
	scratch []byte
	nsent   int

	// The receiving side's.
	nrecv   int
	replied bool // the reply (the final message's body) was returned
	reply   []byte

	tel      callSpan
	telCtx   context.Context
	trailerP *MD
	headerP  *MD  // the Header call option's
	counted  bool // one of ep's outstanding calls (connFor counted it)

	mu      sync.Mutex
	ended   bool
	endErr  error // the end: io.EOF or the status
	header  MD
	hdrDone bool // header is known (Header)
	trailer MD
	abort   error // why the caller ended it (BidiStreamCall: its input failed)
}

// NewStream opens a streaming call to method ("/files.Files/Download"). req, when not
// nil, travels with the open (a server-streaming method's request). Metadata comes from
// ctx (NewOutgoingContext) as for unary calls, and ctx bounds the whole stream: canceling
// it cancels the call on the server. Read to io.EOF, cancel ctx or call Close, or the
// stream's memory stays held.
func (c *Client) NewStream(ctx context.Context, method string, req any, opts ...CallOption) (*ClientStream, error) {
	if is := c.opts.streamInterceptors; len(is) > 0 {
		return chainStreamClient(is, c.openStream)(ctx, method, req, opts...)
	}
	return c.openStream(ctx, method, req, opts...)
}

// openStream is NewStream without the interceptors: the Streamer they end in.
func (c *Client) openStream(ctx context.Context, method string, req any, opts ...CallOption) (*ClientStream, error) {
	var ci callInfo
	applyOptions(&ci, opts)
	return c.newStream(ctx, nil, nil, method, req, &ci)
}

// Streamer opens a stream: the next step of a client stream interceptor chain.
type Streamer func(ctx context.Context, method string, req any, opts ...CallOption) (*ClientStream, error)

// StreamClientInterceptor wraps every stream a client opens (adding metadata to ctx,
// logging, retrying the open), as UnaryClientInterceptor does unary calls.
type StreamClientInterceptor func(ctx context.Context, method string, req any, streamer Streamer, opts ...CallOption) (*ClientStream, error)

// chainStreamClient folds interceptors around open, the first outermost.
func chainStreamClient(is []StreamClientInterceptor, open Streamer) Streamer {
	next := open
	for i := len(is) - 1; i >= 0; i-- {
		ic, n := is[i], next
		next = func(ctx context.Context, method string, req any, opts ...CallOption) (*ClientStream, error) {
			return ic(ctx, method, req, n, opts...)
		}
	}
	return next
}

// newStreamOn opens a streaming call on conn, ep's connection, instead of on the endpoint
// the balancer picks (the health check's Watch of each connection). It fails with
// Unavailable if conn has failed. Unlike NewStream's, the stream is not one of ep's
// outstanding calls: it would weigh on the least-outstanding balancer for as long as
// the connection lasts (the connection's own count, InFlight, has it).
func (c *Client) newStreamOn(ctx context.Context, ep *endpoint, conn *transport.Conn, method string, req any) (*ClientStream, error) {
	return c.newStream(ctx, ep, conn, method, req, &callInfo{})
}

// newStream opens a stream on conn, or, when conn is nil, on the connection connFor
// gives.
func (c *Client) newStream(ctx context.Context, ep *endpoint, conn *transport.Conn, method string, req any, ci *callInfo) (*ClientStream, error) {
	cs := &ClientStream{c: c, ctx: ctx, method: method, cod: c.opts.codec, trailerP: ci.trailer, headerP: ci.header, telCtx: ctx}
	cs.telCtx = c.tel.startClient(ctx, method, &cs.tel)
	err := cs.open(ctx, ep, conn, req, ci.waitForReady)
	if err != nil {
		c.tel.endErr(cs.telCtx, &cs.tel, err)
	}
	if err != nil {
		return nil, err
	}
	return cs, nil
}

// open opens the stream on conn, ep's connection, or, when conn is nil, on the one
// connFor gives: there, a stream that sent nothing (its connection went away between
// connFor and the send) is opened again on another (resend).
func (cs *ClientStream) open(ctx context.Context, ep *endpoint, conn *transport.Conn, req any, waitForReady bool) error {
	if err := ctx.Err(); err != nil { // as gRPC: a stream whose context already ended is not opened
		return StatusOf(err)
	}
	md := outgoing(ctx)
	if err := checkRequest(cs.method, md); err != nil {
		return &Status{Code: InvalidArgument, Message: err.Error(), cause: err}
	}
	if conn != nil {
		if err := conn.Err(); err != nil {
			return &Status{Code: Unavailable, Message: fmt.Sprintf("mwrpc: connection to %s: %v", ep.addr, err), cause: err}
		}
		return cs.openOn(ctx, ep, conn, md, req)
	}
	for try := 1; ; try++ {
		ep, conn, err := cs.c.connFor(ctx, waitForReady)
		if err != nil {
			return err
		}
		cs.counted = true
		err = cs.openOn(ctx, ep, conn, md, req)
		if err == nil || !resend(ctx, err, try) {
			return err
		}
	}
}

// openOn sends the stream's request on conn, ep's: on success the stream is conn's; on
// failure it is no longer counted among ep's calls, and the error is the transport's
// (matching transport.ErrNotSent when nothing was sent) as a status.
func (cs *ClientStream) openOn(ctx context.Context, ep *endpoint, conn *transport.Conn, md MD, req any) error {
	c := cs.c
	var deadline int64
	if dl, ok := ctx.Deadline(); ok {
		deadline = dl.UnixNano()
	}
	b := appendRequest(nil, cs.method, deadline, md)
	b = c.tel.inject(cs.telCtx, b, md)
	var err error
	if req != nil {
		if b, err = encodeMsg(cs.cod, b, req); err != nil {
			cs.uncount(ep)
			return &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: encoding the request of %s: %v", cs.method, err), cause: err}
		}
	}
	ts, err := conn.OpenStream(ctx, b)
	if err != nil {
		cs.uncount(ep)
		return streamErr(ctx, err)
	}
	cs.ep, cs.ts = ep, ts
	return nil
}

// uncount ends the stream's count among ep's outstanding calls, if it has one.
func (cs *ClientStream) uncount(ep *endpoint) {
	if cs.counted {
		ep.outstanding.Add(-1)
	}
}

// Context returns the stream's context.
func (cs *ClientStream) Context() context.Context { return cs.telCtx }

// SendMsg sends one message. After the server ended the stream it returns io.EOF, and
// RecvMsg says how it ended. A []byte message built in Client.Buffer's memory (starting
// where Buffer's does, not empty) leaves from there without a copy, and the stream takes
// the buffer whatever the outcome, as a call does.
func (cs *ClientStream) SendMsg(v any) error {
	var n int
	var err error
	if buf := cs.lentMessage(v); buf != nil {
		n = buf.Len()
		err = cs.ts.SendBuf(cs.ctx, buf)
	} else {
		n, err = sendMsg(cs.ctx, cs.ts, cs.c.tr, cs.cod, &cs.scratch, v)
	}
	if err != nil {
		return streamErr(cs.ctx, err)
	}
	cs.nsent++
	msgEvent(cs.tel.span, true, cs.nsent, n)
	return nil
}

// SendBytes sends p as it is (a []byte message): SendMsg without the interface.
func (cs *ClientStream) SendBytes(p []byte) error { return cs.SendMsg(p) }

// lentMessage returns the buffer of Client.Buffer's that v, a []byte message not empty,
// starts where it does, no longer lent and sliced to v (behind the headroom a call's
// envelope would take); nil for any other message.
func (cs *ClientStream) lentMessage(v any) *pool.Buf {
	p, ok := v.([]byte)
	if !ok || len(p) == 0 {
		return nil
	}
	buf := cs.c.lend.takeRequest(p)
	if buf != nil {
		buf.Slice(requestHeadroom, len(p))
	}
	return buf
}

// CloseSend tells the server no more messages follow; it may go on sending.
func (cs *ClientStream) CloseSend() error {
	if err := cs.ts.CloseSend(cs.ctx); err != nil {
		return streamErr(cs.ctx, err)
	}
	return nil
}

// RecvMsg receives the next message into v. After the server's messages comes its reply,
// if its handler returned one (a client-streaming method's), then io.EOF when the stream
// ended OK, or its status as an error.
func (cs *ClientStream) RecvMsg(v any) error {
	p, err := cs.recv()
	if err != nil {
		return err
	}
	if err := decodeMsg(cs.cod, p, v); err != nil {
		st := &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: decoding a message of %s: %v", cs.method, err), cause: err}
		cs.Close()
		return st
	}
	return nil
}

// RecvBytes receives the next message as it is (a []byte message), valid until the next
// RecvBytes, RecvMsg or Close: it aliases registered memory. Ends as RecvMsg does.
func (cs *ClientStream) RecvBytes() ([]byte, error) { return cs.recv() }

func (cs *ClientStream) recv() ([]byte, error) {
	cs.mu.Lock()
	ended, endErr, abort := cs.ended, cs.endErr, cs.abort
	cs.mu.Unlock()
	if abort != nil {
		return nil, abort
	}
	if ended {
		if cs.reply != nil && !cs.replied {
			cs.replied = true
			return cs.reply, nil
		}
		return nil, endErr
	}
	p, err := cs.ts.Recv(cs.ctx)
	if err == nil {
		cs.nrecv++
		msgEvent(cs.tel.span, false, cs.nrecv, len(p))
		cs.c.heard(cs.ep)
		return p, nil
	}
	if err != io.EOF {
		cs.mu.Lock()
		abort = cs.abort
		cs.mu.Unlock()
		if abort != nil {
			return nil, abort
		}
		err = streamErr(cs.ctx, err)
		cs.end(err)
		return nil, err
	}
	// The server's response: status, trailer, and maybe a reply.
	status, payload, _ := cs.ts.Final()
	var r response
	code := Code(status)
	if perr := parseResponse(payload, &r); perr != nil {
		if code != OK { // produced by the transport itself (overload, panic): plain text
			err = &Status{Code: code, Message: string(payload)}
		} else {
			err = &Status{Code: Internal, Message: perr.Error(), cause: perr}
		}
	} else {
		cs.mu.Lock()
		cs.trailer = decodeMD(r.md, r.nmd)
		cs.mu.Unlock()
		if code != OK {
			st := &Status{Code: code, Message: string(r.msg)}
			st.details, _ = decodeDetails(r.details) // malformed details are dropped; the code stands
			// As for a unary call: the server can see our deadline (or cancel) before our
			// own context says so, the same event, so the status matches the context too.
			if dl, ok := cs.ctx.Deadline(); code == DeadlineExceeded && ok && !time.Now().Before(dl) {
				st.cause = context.DeadlineExceeded
			} else if code == Canceled && cs.ctx.Err() != nil {
				st.cause = cs.ctx.Err()
			}
			err = st
		} else if len(r.body) > 0 {
			cs.reply = bytes.Clone(r.body) // the stream's memory goes back now
		}
	}
	cs.end(err)
	return cs.recv()
}

// end records the stream's end (io.EOF for OK) and releases it.
func (cs *ClientStream) end(err error) {
	cs.mu.Lock()
	if cs.ended {
		cs.mu.Unlock()
		return
	}
	cs.ended, cs.endErr = true, err
	trailer := cs.trailer
	cs.mu.Unlock()
	if cs.trailerP != nil {
		*cs.trailerP = trailer
	}
	if cs.headerP != nil {
		*cs.headerP = cs.headerNow()
	}
	cs.ts.Close()
	cs.uncount(cs.ep)
	if err == io.EOF {
		err = nil
	}
	cs.c.tel.endErr(cs.telCtx, &cs.tel, err)
}

// canceled is a done context: asking the transport stream with it never waits.
var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// headerNow returns the headers as far as they arrived, without waiting.
func (cs *ClientStream) headerNow() MD {
	md, _ := cs.header1(canceled)
	return md
}

// Header returns the response headers the server's handler set (SetHeader, SendHeader),
// waiting until they arrive: ahead of the server's first message, or with its end. It
// may be called while another goroutine sends; not while one receives.
func (cs *ClientStream) Header() (MD, error) { return cs.header1(cs.ctx) }

func (cs *ClientStream) header1(ctx context.Context) (MD, error) {
	cs.mu.Lock()
	if cs.hdrDone {
		defer cs.mu.Unlock()
		return cs.header, nil
	}
	cs.mu.Unlock()
	p, ok, err := cs.ts.Header(ctx)
	if err != nil {
		return nil, streamErr(cs.ctx, err)
	}
	var md MD
	if ok {
		if md, err = parseHeaderMsg(p); err != nil {
			return nil, &Status{Code: Internal, Message: fmt.Sprintf("mwrpc: the response headers of %s: %v", cs.method, err), cause: err}
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if !cs.hdrDone {
		cs.header, cs.hdrDone = md, true
	}
	return cs.header, nil
}

// Trailer returns the metadata the server's handler set (SetTrailer), once the stream
// has ended.
func (cs *ClientStream) Trailer() MD {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.trailer
}

// Close ends the stream: before the server's end, it cancels the call on the server
// (its context is canceled; its sends fail). It may be called more than once, and after
// the end.
func (cs *ClientStream) Close() {
	cs.end(&Status{Code: Canceled, Message: "mwrpc: stream closed by the caller"})
}

// abortWith ends the stream with err, which RecvMsg then returns: the caller's own
// failure (BidiStreamCall's input iterator failed).
func (cs *ClientStream) abortWith(err error) {
	cs.mu.Lock()
	if cs.abort == nil {
		cs.abort = err
	}
	cs.mu.Unlock()
	cs.end(err)
}

// ServerStream is a handler's side of a streaming call. It is valid until the handler
// returns.
type ServerStream struct {
	st      *serverStream // the call: its context, metadata, trailer
	ctx     context.Context
	ts      *transport.Stream
	tr      *transport.Transport
	cod     codec.Codec
	scratch []byte
	nsent   int
	nrecv   int
	lent    []*pool.Buf // Buffer's, not sent yet: released when the handler returns
	sendErr error       // the first failed send's status (Cause); the handler's goroutine's
}

// Buffer returns n bytes of registered memory to build a []byte message in: sent from
// it (or a prefix of it), the message leaves without a copy, through a window when it is
// large. Each sent buffer is the stream's from then on: take a new one for the next
// message. Buffers not sent go back when the handler returns. Like SendMsg, call it from
// the handler's goroutine.
func (ss *ServerStream) Buffer(n int) ([]byte, error) {
	if n > ss.ts.MaxSend() {
		return nil, &Status{Code: ResourceExhausted, Message: fmt.Sprintf("mwrpc: stream buffer of %d bytes, over the maximum message size of %d", n, ss.ts.MaxSend()), cause: transport.ErrTooLarge}
	}
	buf, err := ss.tr.Pool().Get(ss.ctx, n)
	if err != nil {
		return nil, streamErr(ss.ctx, err)
	}
	ss.lent = append(ss.lent, buf)
	return buf.Bytes()[:n], nil
}

// StreamBuffer is ServerStream.Buffer for a streaming handler's context, where an
// iterator producing a stream of []byte has no ServerStream at hand: the bytes it yields
// from such a buffer leave without a copy. Outside a streaming handler it fails with
// FailedPrecondition; fall back to ordinary memory then.
func StreamBuffer(ctx context.Context, n int) ([]byte, error) {
	st, ok := ctx.Value(streamKey{}).(*serverStream)
	if !ok || st.ss == nil {
		return nil, Errorf(FailedPrecondition, "mwrpc: StreamBuffer outside a streaming handler")
	}
	return st.ss.Buffer(n)
}

// takeLent returns the buffer of Buffer's that p is (a prefix of), no longer lent, or nil.
func (ss *ServerStream) takeLent(p []byte) *pool.Buf {
	for i, b := range ss.lent {
		if len(p) > 0 && len(p) <= b.Cap() && unsafe.SliceData(p) == unsafe.SliceData(b.Bytes()) {
			ss.lent = append(ss.lent[:i], ss.lent[i+1:]...)
			b.SetLen(len(p))
			return b
		}
	}
	return nil
}

// Context returns the handler's context: canceled when the caller cancels or goes.
func (ss *ServerStream) Context() context.Context { return ss.ctx }

// Request decodes the request that came with the open (a server-streaming method's).
func (ss *ServerStream) Request(v any) error {
	if err := decodeMsg(ss.cod, ss.st.body, v); err != nil {
		return &Status{Code: InvalidArgument, Message: fmt.Sprintf("mwrpc: decoding the request of %s: %v", ss.st.method.full, err), cause: err}
	}
	return nil
}

// sendHeader sends the headers SetHeader gathered as the stream's header message, once.
func (ss *ServerStream) sendHeader() error {
	if ss.st.hdrSent {
		return nil
	}
	ss.st.hdrSent = true
	if len(ss.st.header) == 0 {
		return nil
	}
	if err := ss.ts.SendHeader(ss.ctx, appendHeaderMD(nil, ss.st.header)); err != nil {
		return ss.failed(streamErr(ss.ctx, err))
	}
	return nil
}

// SendMsg sends one message to the caller, waiting while its window is full. A []byte
// message built in Buffer's memory leaves without a copy. The first message sends the
// headers (SetHeader) ahead of it.
func (ss *ServerStream) SendMsg(v any) error {
	if !ss.st.hdrSent {
		if err := ss.sendHeader(); err != nil {
			return err
		}
	}
	if p, ok := v.([]byte); ok && len(ss.lent) > 0 {
		if b := ss.takeLent(p); b != nil {
			if err := ss.ts.SendBuf(ss.ctx, b); err != nil {
				return ss.failed(streamErr(ss.ctx, err))
			}
			ss.nsent++
			msgEvent(ss.st.tel.span, true, ss.nsent, len(p))
			return nil
		}
	}
	n, err := sendMsg(ss.ctx, ss.ts, ss.tr, ss.cod, &ss.scratch, v)
	if err != nil {
		return ss.failed(streamErr(ss.ctx, err))
	}
	ss.nsent++
	msgEvent(ss.st.tel.span, true, ss.nsent, n)
	return nil
}

// failed records the first failed send, for Cause, and returns err.
func (ss *ServerStream) failed(err error) error {
	if ss.sendErr == nil {
		ss.sendErr = err
	}
	return err
}

// SendBytes sends p as it is (a []byte message).
func (ss *ServerStream) SendBytes(p []byte) error { return ss.SendMsg(p) }

// RecvMsg receives the caller's next message into v; io.EOF once the caller closed its
// side (CloseSend) and everything before was read.
func (ss *ServerStream) RecvMsg(v any) error {
	p, err := ss.RecvBytes()
	if err != nil {
		return err
	}
	if err := decodeMsg(ss.cod, p, v); err != nil {
		return &Status{Code: InvalidArgument, Message: fmt.Sprintf("mwrpc: decoding a message of %s: %v", ss.st.method.full, err), cause: err}
	}
	return nil
}

// RecvBytes receives the caller's next message as it is (a []byte message), valid until
// the next RecvBytes or RecvMsg, or the handler's return: it aliases registered memory.
func (ss *ServerStream) RecvBytes() ([]byte, error) {
	p, err := ss.ts.Recv(ss.ctx)
	if err != nil {
		return nil, streamErr(ss.ctx, err)
	}
	ss.nrecv++
	msgEvent(ss.st.tel.span, false, ss.nrecv, len(p))
	return p, nil
}

// handleStream serves a request that opened a stream.
func (s *Server) handleStream(ctx context.Context, r *request, m *method, w *transport.ResponseWriter) {
	st := &serverStream{} // not pooled: the handler may keep the ServerStream or its context
	st.dec = st.decode
	if cancel := s.begin(st, ctx, r, m, w); cancel != nil {
		defer cancel()
	}
	ss := &ServerStream{st: st, ctx: st, ts: w.Stream(), tr: s.tr, cod: m.codec}
	st.ss = ss
	reply, err := s.invokeStream(ss, m)
	for _, b := range ss.lent {
		b.Release()
	}
	ss.lent = nil
	_ = ss.sendHeader() // headers set but not sent go ahead of the end (no message took them)
	if err != nil {
		status := handlerStatus(err, r.deadline)
		s.writeStatus(w, st, status)
	} else {
		s.writeReply(w, st, m, reply)
	}
	s.endServerSpan(st, w)
}

// invokeStream runs a streaming method, through the interceptor if any; a panic becomes
// Internal.
func (s *Server) invokeStream(ss *ServerStream, m *method) (reply any, err error) {
	defer func() {
		if r := recover(); r != nil {
			reply, err = nil, Errorf(Internal, "handler %s panicked: %v", m.full, r)
		}
	}()
	if s.opts.streamInterceptor == nil {
		return m.stream.Handler(m.impl, ss)
	}
	info := &StreamServerInfo{Server: m.impl, FullMethod: m.full, ClientStreams: m.stream.ClientStreams, ServerStreams: m.stream.ServerStreams}
	return s.opts.streamInterceptor(m.impl, ss, info, m.stream.Handler)
}

// writeReply ends a stream with OK and, when reply is not nil, the reply as its body.
func (s *Server) writeReply(w *transport.ResponseWriter, st *serverStream, m *method, reply any) {
	out := appendResponse(nil, st.unsentHeader(), st.trailer, "")
	if reply != nil {
		var err error
		if out, err = encodeMsg(m.codec, out, reply); err != nil {
			s.writeError(w, st, Internal, fmt.Sprintf("encoding the reply of %s: %v", m.full, err))
			return
		}
	}
	st.code, st.respLen = OK, len(out)
	if err := w.Write(OK, out); err != nil {
		s.opts.logger.Debug("mwrpc: stream's end not sent", "method", m.full, "err", err)
	}
}

// WithStreamInterceptor installs an interceptor around every streaming call the server
// runs; unary calls go through WithUnaryInterceptor's. A second call replaces the first.
func WithStreamInterceptor(i StreamServerInterceptor) ServerOption {
	return serverOption(func(o *serverOptions) { o.streamInterceptor = i })
}
