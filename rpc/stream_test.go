package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// A hand-written streaming service, shaped as cmd/mwrpcgen writes them.
type Streams interface {
	// Count yields m.N messages, each with a Blob of len(m.Blob) bytes (m.Text "fail@k":
	// fails after k messages; "stall": stalls after one until its context ends).
	Count(ctx context.Context, m *Msg) iter.Seq2[*Msg, error]
	// Sum adds up the messages' N and Blob lengths (a message with Text "fail": fails).
	Sum(ctx context.Context, in iter.Seq2[*Msg, error]) (*Msg, error)
	// Echo answers each message with itself.
	Echo(ctx context.Context, in iter.Seq2[*Msg, error]) iter.Seq2[*Msg, error]
	// Chunks yields m.N chunks of len(m.Blob) bytes, chunk i filled with byte i, built in
	// StreamBuffer's memory (and takes one more buffer it never sends).
	Chunks(ctx context.Context, m *Msg) iter.Seq2[[]byte, error]
}

type streamsClient struct{ cc rpc.Invoker }

func (c streamsClient) Count(ctx context.Context, m *Msg) iter.Seq2[*Msg, error] {
	return rpc.ServerStreamCall(ctx, c.cc, "/test.Streams/Count", m, rpc.RecvPtr[Msg])
}
func (c streamsClient) Sum(ctx context.Context, in iter.Seq2[*Msg, error]) (*Msg, error) {
	out := new(Msg)
	if err := rpc.ClientStreamCall(ctx, c.cc, "/test.Streams/Sum", in, out); err != nil {
		return nil, err
	}
	return out, nil
}
func (c streamsClient) Echo(ctx context.Context, in iter.Seq2[*Msg, error]) iter.Seq2[*Msg, error] {
	return rpc.BidiStreamCall(ctx, c.cc, "/test.Streams/Echo", in, rpc.RecvPtr[Msg])
}
func (c streamsClient) Chunks(ctx context.Context, m *Msg) iter.Seq2[[]byte, error] {
	return rpc.ServerStreamCall(ctx, c.cc, "/test.Streams/Chunks", m, rpc.RecvBytes)
}

var streamsDesc = rpc.ServiceDesc{
	ServiceName: "test.Streams",
	HandlerType: (*Streams)(nil),
	Streams: []rpc.StreamDesc{
		{StreamName: "Count", ServerStreams: true, Handler: func(srv any, stream *rpc.ServerStream) (any, error) {
			in := new(Msg)
			if err := stream.Request(in); err != nil {
				return nil, err
			}
			return nil, rpc.SendAll(stream, srv.(Streams).Count(stream.Context(), in))
		}},
		{StreamName: "Sum", ClientStreams: true, Handler: func(srv any, stream *rpc.ServerStream) (any, error) {
			out, err := srv.(Streams).Sum(stream.Context(), rpc.RecvAll(stream, rpc.RecvPtr[Msg]))
			if err != nil {
				return nil, err
			}
			return out, nil
		}},
		{StreamName: "Echo", ClientStreams: true, ServerStreams: true, Handler: func(srv any, stream *rpc.ServerStream) (any, error) {
			return nil, rpc.SendAll(stream, srv.(Streams).Echo(stream.Context(), rpc.RecvAll(stream, rpc.RecvPtr[Msg])))
		}},
		{StreamName: "Chunks", ServerStreams: true, Handler: func(srv any, stream *rpc.ServerStream) (any, error) {
			in := new(Msg)
			if err := stream.Request(in); err != nil {
				return nil, err
			}
			return nil, rpc.SendAll(stream, srv.(Streams).Chunks(stream.Context(), in))
		}},
	},
}

type streamsImpl struct {
	produced atomic.Int64 // messages Count has had sent
	ended    chan error   // each handler's context error when it returned
}

func (s *streamsImpl) done(ctx context.Context) {
	select {
	case s.ended <- ctx.Err():
	default:
	}
}

func (s *streamsImpl) Count(ctx context.Context, m *Msg) iter.Seq2[*Msg, error] {
	return func(yield func(*Msg, error) bool) {
		defer s.done(ctx)
		var failAt int64 = -1
		fmt.Sscanf(m.Text, "fail@%d", &failAt)
		for i := int64(0); i < m.N; i++ {
			if i == failAt {
				yield(nil, rpc.Errorf(rpc.DataLoss, "failed after %d", i))
				return
			}
			if m.Text == "stall" && i == 1 {
				<-ctx.Done()
				yield(nil, ctx.Err())
				return
			}
			if !yield(&Msg{N: i, Blob: m.Blob}, nil) {
				return
			}
			s.produced.Add(1)
		}
		if md, ok := rpc.FromIncomingContext(ctx); ok && len(md["x-echo"]) > 0 {
			rpc.SetTrailer(ctx, rpc.MD{"x-echoed": md["x-echo"]})
		}
	}
}

func (s *streamsImpl) Sum(ctx context.Context, in iter.Seq2[*Msg, error]) (*Msg, error) {
	defer s.done(ctx)
	var n, size int64
	for m, err := range in {
		if err != nil {
			return nil, err
		}
		if m.Text == "fail" {
			return nil, rpc.Errorf(rpc.FailedPrecondition, "refused at %d", m.N)
		}
		n += m.N
		size += int64(len(m.Blob))
	}
	return &Msg{N: n, Text: fmt.Sprint(size)}, nil
}

func (s *streamsImpl) Chunks(ctx context.Context, m *Msg) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		for i := int64(0); i < m.N; i++ {
			b, err := rpc.StreamBuffer(ctx, len(m.Blob))
			if err != nil {
				yield(nil, err)
				return
			}
			for j := range b {
				b[j] = byte(i)
			}
			if !yield(b, nil) {
				return
			}
		}
		if _, err := rpc.StreamBuffer(ctx, 1<<20); err != nil { // never sent: released at the end
			yield(nil, err)
		}
	}
}

func (s *streamsImpl) Echo(ctx context.Context, in iter.Seq2[*Msg, error]) iter.Seq2[*Msg, error] {
	return func(yield func(*Msg, error) bool) {
		defer s.done(ctx)
		for m, err := range in {
			if err != nil || !yield(m, err) {
				return
			}
		}
	}
}

// streamEnv is an env with the streaming service too, a server log, and a check that the
// stream left nothing behind.
type streamEnv struct {
	*env
	impl    *streamsImpl
	streams Streams
	log     *syncBuffer
}

func startStreams(t *testing.T, sopts []rpc.ServerOption, copts ...rpc.DialOption) *streamEnv {
	t.Helper()
	log := new(syncBuffer)
	sopts = append(sopts, rpc.WithLogger(slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	e := start(t, sopts, copts...)
	return &streamEnv{env: e, impl: e.streams, streams: streamsClient{e.client}, log: log}
}

// clean waits until neither side has a window bound or a handler running, then closes
// both and checks that every pool buffer came back.
func (e *streamEnv) clean(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, s := e.client.Stats(), e.srv.Stats()
		if c.WindowsExposed == 0 && s.WindowsExposed == 0 && s.Handlers == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the stream: %d client and %d server windows bound, %d handlers running", c.WindowsExposed, s.WindowsExposed, s.Handlers)
		}
		time.Sleep(time.Millisecond)
	}
	if err := e.client.Close(); err != nil {
		t.Fatalf("client close (a pool buffer not returned?): %v", err)
	}
	e.srv.Stop()
	if strings.Contains(e.log.String(), "close") {
		t.Fatalf("server close: %s", e.log.String())
	}
}

func msgs(n int, blob int) iter.Seq2[*Msg, error] {
	return func(yield func(*Msg, error) bool) {
		for i := range n {
			if !yield(&Msg{N: int64(i), Blob: bytes.Repeat([]byte{byte(i)}, blob)}, nil) {
				return
			}
		}
	}
}

func TestStreamKinds(t *testing.T) {
	for _, size := range []int{0, 100, 300 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			e := startStreams(t, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			n := int64(0)
			for m, err := range e.streams.Count(ctx, &Msg{N: 30, Blob: make([]byte, size)}) {
				if err != nil {
					t.Fatal(err)
				}
				if m.N != n || len(m.Blob) != size {
					t.Fatalf("Count's message %d: %d with %d bytes", n, m.N, len(m.Blob))
				}
				n++
			}
			if n != 30 {
				t.Fatalf("Count yielded %d messages, want 30", n)
			}
			sum, err := e.streams.Sum(ctx, msgs(30, size))
			if err != nil || sum.N != 435 || sum.Text != fmt.Sprint(30*size) {
				t.Fatalf("Sum: %+v %v", sum, err)
			}
			i := 0
			for m, err := range e.streams.Echo(ctx, msgs(30, size)) {
				if err != nil {
					t.Fatal(err)
				}
				if m.N != int64(i) || !bytes.Equal(m.Blob, bytes.Repeat([]byte{byte(i)}, size)) {
					t.Fatalf("Echo's message %d came back as %d with %d bytes", i, m.N, len(m.Blob))
				}
				i++
			}
			if i != 30 {
				t.Fatalf("Echo yielded %d messages, want 30", i)
			}
			if st := e.client.Stats(); size > 16<<10 && st.Reads == 0 {
				t.Fatalf("large messages were not fetched with RDMA READ: %+v", st)
			}
			e.clean(t)
		})
	}
}

// TestStreamFlowControl: a caller that stops reading holds the server to its window.
func TestStreamFlowControl(t *testing.T) {
	const window, blob = 256 << 10, 64 << 10
	e := startStreams(t, nil, rpc.WithTransport(transport.Config{StreamWindow: window}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	read := 0
	for _, err := range e.streams.Count(ctx, &Msg{N: 1000, Blob: make([]byte, blob)}) {
		if err != nil {
			t.Fatal(err)
		}
		if read++; read == 3 {
			time.Sleep(300 * time.Millisecond) // stop reading: the server fills the window, and waits
			// Sent, at most: what was read, a window, and the one the window let through
			// with nothing outstanding; the producer has one more in hand.
			if p, limit := e.impl.produced.Load(), int64(read+window/blob+2); p > limit {
				t.Fatalf("the server produced %d messages of %d bytes for a reader that stopped at %d (window %d)", p, blob, read, window)
			}
			break // cancels the call
		}
	}
	if err := <-e.impl.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the handler's context: %v, want canceled", err)
	}
	e.clean(t)
}

// TestStreamEnds: a stream ends cleanly however it ends, and leaves nothing behind.
func TestStreamEnds(t *testing.T) {
	big := make([]byte, 100<<10)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e *streamEnv)
	}{
		{"caller breaks", func(t *testing.T, e *streamEnv) {
			for range e.streams.Count(context.Background(), &Msg{N: 1000, Blob: big}) {
				break
			}
			if err := <-e.impl.ended; !errors.Is(err, context.Canceled) {
				t.Fatalf("the handler's context: %v", err)
			}
		}},
		{"caller breaks bidi", func(t *testing.T, e *streamEnv) {
			for range e.streams.Echo(context.Background(), msgs(1000, 100<<10)) {
				break
			}
			<-e.impl.ended
		}},
		{"server fails", func(t *testing.T, e *streamEnv) {
			n := 0
			var last error
			for _, err := range e.streams.Count(context.Background(), &Msg{N: 10, Blob: big, Text: "fail@4"}) {
				if err != nil {
					last = err
					break
				}
				n++
			}
			if n != 4 || rpc.CodeOf(last) != rpc.DataLoss {
				t.Fatalf("%d messages then %v; want 4 then DataLoss", n, last)
			}
		}},
		{"server refuses an upload", func(t *testing.T, e *streamEnv) {
			in := func(yield func(*Msg, error) bool) {
				yield(&Msg{N: 1, Blob: big}, nil)
				yield(&Msg{N: 2, Text: "fail"}, nil)
				for i := 0; i < 10000; i++ { // the server's answer ends the sending
					if !yield(&Msg{N: 3, Blob: big}, nil) {
						return
					}
				}
			}
			_, err := e.streams.Sum(context.Background(), in)
			if rpc.CodeOf(err) != rpc.FailedPrecondition {
				t.Fatalf("Sum: %v, want FailedPrecondition", err)
			}
		}},
		{"upload's input fails", func(t *testing.T, e *streamEnv) {
			boom := errors.New("boom")
			in := func(yield func(*Msg, error) bool) {
				if yield(&Msg{N: 1, Blob: big}, nil) {
					yield(nil, boom)
				}
			}
			if _, err := e.streams.Sum(context.Background(), in); !errors.Is(err, boom) {
				t.Fatalf("Sum: %v, want the input's error", err)
			}
			if err := <-e.impl.ended; !errors.Is(err, context.Canceled) {
				t.Fatalf("the handler's context: %v", err)
			}
		}},
		{"deadline", func(t *testing.T, e *streamEnv) {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			var last error
			for _, err := range e.streams.Count(ctx, &Msg{N: 10, Blob: big, Text: "stall"}) {
				last = err
			}
			if rpc.CodeOf(last) != rpc.DeadlineExceeded || !errors.Is(last, context.DeadlineExceeded) {
				t.Fatalf("%v, want DeadlineExceeded", last)
			}
			if err := <-e.impl.ended; err == nil {
				t.Fatal("the handler's context did not end")
			}
		}},
		{"connection lost", func(t *testing.T, e *streamEnv) {
			var last error
			n := 0
			for _, err := range e.streams.Count(context.Background(), &Msg{N: 10, Blob: big, Text: "stall"}) {
				if err != nil {
					last = err
					break
				}
				if n++; n == 1 {
					go e.srv.Stop()
				}
			}
			if rpc.CodeOf(last) != rpc.Unavailable {
				t.Fatalf("%v, want Unavailable", last)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startStreams(t, nil)
			tc.run(t, e)
			e.clean(t)
		})
	}
}

// TestStreamMetadataAndMisuse: metadata goes both ways; a streaming method called as a
// unary one, and the other way round, is Unimplemented with a message saying which.
func TestStreamMetadataAndMisuse(t *testing.T) {
	var intercepted atomic.Value
	e := startStreams(t, []rpc.ServerOption{rpc.WithStreamInterceptor(func(srv any, stream *rpc.ServerStream, info *rpc.StreamServerInfo, h rpc.StreamHandler) (any, error) {
		intercepted.Store(*info)
		return h(srv, stream)
	})})
	ctx := rpc.NewOutgoingContext(context.Background(), rpc.Pairs("x-echo", "hi"))
	cs, err := e.client.NewStream(ctx, "/test.Streams/Count", &Msg{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	for {
		var m Msg
		if err := cs.RecvMsg(&m); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if got := cs.Trailer()["x-echoed"]; len(got) != 1 || got[0] != "hi" {
		t.Fatalf("trailer %v", cs.Trailer())
	}
	if info, _ := intercepted.Load().(rpc.StreamServerInfo); info.FullMethod != "/test.Streams/Count" || !info.ServerStreams || info.ClientStreams {
		t.Fatalf("the stream interceptor saw %+v", info)
	}
	if err := e.client.Invoke(context.Background(), "/test.Streams/Count", &Msg{}, new(Msg)); rpc.CodeOf(err) != rpc.Unimplemented || !strings.Contains(err.Error(), "streaming method") {
		t.Fatalf("Invoke of a streaming method: %v", err)
	}
	cs, err = e.client.NewStream(context.Background(), "/test.Svc/Echo", &Msg{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(Msg)); rpc.CodeOf(err) != rpc.Unimplemented || !strings.Contains(err.Error(), "unary method") {
		t.Fatalf("a stream to a unary method: %v", err)
	}
	cs, err = e.client.NewStream(context.Background(), "/test.Streams/Nope", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(Msg)); rpc.CodeOf(err) != rpc.Unimplemented {
		t.Fatalf("a stream to an unknown method: %v", err)
	}
	e.clean(t)
}

// TestStreamTelemetry: a stream is one span on each side, the server's a child of the
// caller's, with an rpc.message event per message and its size.
func TestStreamTelemetry(t *testing.T) {
	te := startTelemetry(t)
	streams := streamsClient{te.client}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	for _, err := range streams.Count(ctx, &Msg{N: 3, Blob: make([]byte, 100<<10)}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	cs, ss := waitSpans(t, te.clientSpans, 1)[0], waitSpans(t, te.serverSpans, 1)[0]
	if cs.Name() != "test.Streams/Count" || ss.Name() != "test.Streams/Count" {
		t.Fatalf("span names %q and %q", cs.Name(), ss.Name())
	}
	if ss.Parent().SpanID() != cs.SpanContext().SpanID() {
		t.Fatal("the server's span is not the caller's child")
	}
	for _, tc := range []struct {
		side string
		span sdktrace.ReadOnlySpan
		typ  string
	}{{"client", cs, "RECEIVED"}, {"server", ss, "SENT"}} {
		events := tc.span.Events()
		if len(events) != 3 {
			t.Fatalf("%s span: %d events, want one per message (3)", tc.side, len(events))
		}
		for i, ev := range events {
			a := attrsOf(ev.Attributes)
			if ev.Name != "rpc.message" || a["rpc.message.type"] != tc.typ || a["rpc.message.id"] != fmt.Sprint(i+1) {
				t.Fatalf("%s span event %d: %s %v", tc.side, i, ev.Name, a)
			}
			if size := a["rpc.message.uncompressed_size"]; size < "102400" || len(size) != 6 {
				t.Fatalf("%s span event %d: size %s, want the message's (100 KiB and its field headers)", tc.side, i, size)
			}
		}
		if got := attrsOf(tc.span.Attributes())["rpc.response.status_code"]; got != "OK" {
			t.Fatalf("%s span status %q", tc.side, got)
		}
	}
}

// TestStreamBuffer: chunks built in StreamBuffer's registered memory arrive intact, sent
// without a copy; a buffer never sent goes back to the pool (clean checks).
func TestStreamBuffer(t *testing.T) {
	e := startStreams(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, size := range []int{100, 200 << 10} {
		i := 0
		for b, err := range e.streams.Chunks(ctx, &Msg{N: 20, Blob: make([]byte, size)}) {
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != size || b[0] != byte(i) || b[size-1] != byte(i) {
				t.Fatalf("chunk %d of %d bytes: %d bytes, first %d", i, size, len(b), b[0])
			}
			i++
		}
		if i != 20 {
			t.Fatalf("%d chunks of %d bytes, want 20", i, size)
		}
	}
	if _, err := rpc.StreamBuffer(ctx, 10); rpc.CodeOf(err) != rpc.FailedPrecondition {
		t.Fatalf("StreamBuffer outside a handler: %v", err)
	}
	e.clean(t)
}

// TestStreamClientInterceptor: a client stream interceptor sees every stream the client
// opens, generated streaming methods' too, and can add metadata to it.
func TestStreamClientInterceptor(t *testing.T) {
	var seen atomic.Value
	add := func(ctx context.Context, method string, req any, streamer rpc.Streamer, opts ...rpc.CallOption) (*rpc.ClientStream, error) {
		seen.Store(method)
		return streamer(rpc.NewOutgoingContext(ctx, rpc.Pairs("x-echo", "from-interceptor")), method, req, opts...)
	}
	e := startStreams(t, nil, rpc.WithClientStreamInterceptor(add))
	var trailer rpc.MD
	cs, err := e.client.NewStream(context.Background(), "/test.Streams/Count", &Msg{N: 1}, rpc.Trailer(&trailer))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if err := cs.RecvMsg(new(Msg)); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if got := trailer["x-echoed"]; len(got) != 1 || got[0] != "from-interceptor" {
		t.Fatalf("trailer %v: the interceptor's metadata did not travel", trailer)
	}
	for range e.streams.Chunks(context.Background(), &Msg{N: 1, Blob: []byte("x")}) {
	}
	if m, _ := seen.Load().(string); m != "/test.Streams/Chunks" {
		t.Fatalf("the interceptor last saw %q, want the generated method's stream", m)
	}
	e.clean(t)
}
