package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/internal/parcopy"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// rawDesc is a service on []byte both ways, as mwrpcgen writes one (a BytesHandler), whose
// methods answer with their request (Echo: the same memory), a part of it (Tail: all but
// its first 10 bytes) or a copy (Clone).
var rawDesc = rpc.ServiceDesc{
	ServiceName: "test.Raw",
	HandlerType: (*any)(nil),
	Methods: []rpc.MethodDesc{
		rawMethod("Echo", func(b []byte) []byte { return b }),
		rawMethod("Tail", func(b []byte) []byte { return b[min(10, len(b)):] }),
		rawMethod("Clone", bytes.Clone),
	},
	Streams: []rpc.StreamDesc{
		{StreamName: "Collect", ClientStreams: true, Codec: codec.Raw{}, Handler: collectStream},
	},
}

// collectStream is a client stream's handler that wants message i to be pattern(len, i), and
// answers how many came and their bytes in all.
func collectStream(_ any, s *rpc.ServerStream) (any, error) {
	var n, size int
	for {
		p, err := s.RecvBytes()
		if errors.Is(err, io.EOF) {
			return []byte(fmt.Sprintf("%d messages, %d bytes", n, size)), nil
		}
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(p, pattern(len(p), n)) {
			return nil, rpc.Errorf(rpc.DataLoss, "message %d (%d bytes) is not what was sent", n, len(p))
		}
		n, size = n+1, size+len(p)
	}
}

func rawMethod(name string, f func([]byte) []byte) rpc.MethodDesc {
	return rpc.MethodDesc{MethodName: name, Codec: codec.Raw{},
		Handler: func(_ any, _ context.Context, dec func(any) error, _ rpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			return f(in), nil
		},
		BytesHandler: func(_ any, _ context.Context, req []byte) ([]byte, error) { return f(req), nil },
	}
}

// lendEnv is a server of rawDesc and a client of it.
type lendEnv struct {
	srv    *rpc.Server
	client *rpc.Client
}

func startLend(t *testing.T, sopts []rpc.ServerOption, copts ...rpc.DialOption) *lendEnv {
	t.Helper()
	e := &lendEnv{}
	e.srv, e.client, _ = serve(t, func(srv *rpc.Server) {
		var impl any = struct{}{}
		srv.RegisterService(&rawDesc, impl)
	}, true, sopts, copts...)
	return e
}

// inUse is how many pooled buffers of 128 KiB or more are handed out: those of large
// messages. (Smaller ones include the connections' send slots, made on first use and
// kept, whose number depends on how many messages were in flight at once; the client's
// Close, which fails on any buffer still out, checks those.) Less the server's grants for
// a next request (transport Stats.Grants: one a connection at most, kept until used, its
// lease or Close): on the fabrics that grant, whose eager threshold is 64 KiB, each is a
// buffer of 128 KiB or more.
func inUse(st transport.Stats) int {
	n := -st.Grants
	for _, c := range st.Pool.Classes {
		if c.Size >= 128<<10 {
			n += c.InUse
		}
	}
	return n
}

// settled waits until both sides hold the large buffers they held at base (the windows of
// the last call are revoked a moment after it returns) and fails the test otherwise.
func (e *lendEnv) settled(t *testing.T, what string, client, server int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, s := inUse(e.client.Stats()), inUse(e.srv.Stats())
		if c == client && s == server {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: buffers in use: client %d, server %d; want %d and %d", what, c, s, client, server)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
	return b
}

// TestBufferAndLentResponses calls with requests built in Client.Buffer's memory, with and
// without WithLentResponses, at sizes that travel inside a SEND and through windows, to
// methods that answer from the request's memory, a part of it, or a copy: every answer is
// right, the request's memory is taken by the call, a lent response is given back once,
// and no buffer is left behind on either side.
func TestBufferAndLentResponses(t *testing.T) {
	for _, lent := range []bool{false, true} {
		t.Run(fmt.Sprintf("lent=%v", lent), func(t *testing.T) {
			var copts []rpc.DialOption
			if lent {
				copts = append(copts, rpc.WithLentResponses())
			}
			e := startLend(t, nil, copts...)
			ctx := context.Background()
			if _, err := e.client.InvokeBytes(ctx, "/test.Raw/Echo", []byte("warm")); err != nil {
				t.Fatal(err)
			}
			e.settled(t, "warm-up", inUse(e.client.Stats()), inUse(e.srv.Stats()))
			baseC, baseS := inUse(e.client.Stats()), inUse(e.srv.Stats())
			for _, n := range []int{1, 100, 20 << 10, 70 << 10, 1 << 20} {
				for _, m := range []string{"Echo", "Tail", "Clone"} {
					want := pattern(n, n)
					if m == "Tail" {
						want = want[min(10, n):]
					}
					buf, err := e.client.Buffer(ctx, n)
					if err != nil {
						t.Fatal(err)
					}
					copy(buf, pattern(n, n))
					out, err := e.client.InvokeBytes(ctx, "/test.Raw/"+m, buf)
					if err != nil {
						t.Fatalf("%s of %d bytes: %v", m, n, err)
					}
					if !bytes.Equal(out, want) {
						t.Fatalf("%s of %d bytes: %d bytes back, not the ones sent", m, n, len(out))
					}
					if err := e.client.Release(buf); rpc.CodeOf(err) != rpc.InvalidArgument {
						t.Fatalf("Release of a Buffer the call took: %v, want InvalidArgument", err)
					}
					if lent && len(out) > 0 {
						if err := e.client.Release(out); err != nil {
							t.Fatalf("Release of a lent response: %v", err)
						}
						if err := e.client.Release(out); rpc.CodeOf(err) != rpc.InvalidArgument {
							t.Fatalf("second Release of a lent response: %v, want InvalidArgument", err)
						}
					} else if err := e.client.Release(out); rpc.CodeOf(err) != rpc.InvalidArgument {
						t.Fatalf("Release of a response that is the caller's copy: %v, want InvalidArgument", err)
					}
					e.settled(t, fmt.Sprintf("%s of %d bytes", m, n), baseC, baseS)
				}
			}
		})
	}
}

// TestCopiesInPieces: with helpers to copy large payloads in pieces (which a machine of
// two cores never gives), calls whose request and response are copied (the client's
// request into registered memory, the server's response, the client's copy of the
// response; over shm, the READs and WRITEs the memory's owner copies) return every byte,
// at sizes below and above where each copy splits and that split into pieces and pages
// unevenly, and leave no buffer behind.
func TestCopiesInPieces(t *testing.T) {
	defer parcopy.SetHelpers(3)()
	e := startLend(t, []rpc.ServerOption{rpc.WithTransport(transport.Config{MaxMessage: 8 << 20})})
	ctx := context.Background()
	if _, err := e.client.InvokeBytes(ctx, "/test.Raw/Echo", []byte("warm")); err != nil {
		t.Fatal(err)
	}
	e.settled(t, "warm-up", inUse(e.client.Stats()), inUse(e.srv.Stats()))
	baseC, baseS := inUse(e.client.Stats()), inUse(e.srv.Stats())
	splits := parcopy.Splits()
	for _, n := range []int{256 << 10, 1<<20 + 7, 5<<20 + 4099} {
		for _, m := range []string{"Echo", "Clone"} {
			want := pattern(n, n+len(m))
			out, err := e.client.InvokeBytes(ctx, "/test.Raw/"+m, want)
			if err != nil {
				t.Fatalf("%s of %d bytes: %v", m, n, err)
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("%s of %d bytes: %d bytes back, not the ones sent", m, n, len(out))
			}
			e.settled(t, fmt.Sprintf("%s of %d bytes", m, n), baseC, baseS)
		}
	}
	if parcopy.Splits() == splits {
		t.Error("no copy was split: the calls did not take the path under test")
	}
}

// TestBufferPaths covers the other ways a Buffer goes: given back unsent, sent through an
// interceptor (Invoke), sent behind an envelope too large for its headroom (copied once),
// refused as too large, sent on a call that fails, left lent at Close; and the misuses:
// a negative size, a Release of memory the client never lent.
func TestBufferPaths(t *testing.T) {
	ctx := context.Background()
	e := startLend(t, []rpc.ServerOption{rpc.WithTransport(transport.Config{MaxMessage: 2 << 20})}, rpc.WithLentResponses())
	if _, err := e.client.InvokeBytes(ctx, "/test.Raw/Echo", []byte("warm")); err != nil {
		t.Fatal(err)
	}
	e.settled(t, "warm-up", inUse(e.client.Stats()), inUse(e.srv.Stats()))
	baseC, baseS := inUse(e.client.Stats()), inUse(e.srv.Stats())
	buffer := func(n int) []byte {
		t.Helper()
		b, err := e.client.Buffer(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		copy(b, pattern(n, 3))
		return b
	}

	b := buffer(1 << 20)
	if err := e.client.Release(b); err != nil {
		t.Fatalf("Release of an unsent Buffer: %v", err)
	}
	e.settled(t, "an unsent Buffer released", baseC, baseS)

	var out []byte
	var err error
	if err = e.client.Invoke(ctx, "/test.Raw/Echo", buffer(1<<20), &out); err != nil || !bytes.Equal(out, pattern(1<<20, 3)) {
		t.Fatalf("Invoke with a Buffer: %d bytes, %v", len(out), err)
	}
	if err := e.client.Release(out); err != nil {
		t.Fatalf("Release of Invoke's lent response: %v", err)
	}
	e.settled(t, "Invoke with a Buffer", baseC, baseS)

	bigMD := rpc.NewOutgoingContext(ctx, rpc.MD{"x-big": {string(bytes.Repeat([]byte("m"), 2000))}})
	if out, err = e.client.InvokeBytes(bigMD, "/test.Raw/Tail", buffer(200<<10)); err != nil || !bytes.Equal(out, pattern(200<<10, 3)[10:]) {
		t.Fatalf("a Buffer behind 2 KB of metadata: %d bytes, %v", len(out), err)
	}
	_ = e.client.Release(out)
	e.settled(t, "a Buffer behind a large envelope", baseC, baseS)

	if _, err := e.client.InvokeBytes(ctx, "/test.Raw/Echo", buffer(3<<20)); rpc.CodeOf(err) != rpc.ResourceExhausted {
		t.Fatalf("a Buffer over the server's MaxMessage: %v, want ResourceExhausted", err)
	}
	e.settled(t, "a Buffer over MaxMessage", baseC, baseS)

	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.client.InvokeBytes(gone, "/test.Raw/Echo", buffer(1<<20)); !errors.Is(err, context.Canceled) {
		t.Fatalf("a Buffer on a canceled call: %v, want Canceled", err)
	}
	e.settled(t, "a Buffer on a canceled call", baseC, baseS)

	if _, err := e.client.Buffer(ctx, -1); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Errorf("Buffer(-1): %v, want InvalidArgument", err)
	}
	if err := e.client.Release(make([]byte, 10)); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Errorf("Release of the caller's own memory: %v, want InvalidArgument", err)
	}
	b = buffer(64 << 10)
	if err := e.client.Release(b[1:]); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Errorf("Release of a Buffer from its second byte: %v, want InvalidArgument", err)
	}
	// Left lent, with a lent response: Close gives both back (the pool's Close fails on
	// buffers still out, and startLend's cleanup checks Close's error).
	if _, err = e.client.InvokeBytes(ctx, "/test.Raw/Echo", buffer(100<<10)); err != nil {
		t.Fatal(err)
	}
}

// TestClientAllocs counts the allocations of one echo through the generated stub, client
// and server in one process (so both sides; the client's alone is at most that), averaged
// over 50 calls: the caller's own copy of the response is the one allocation of the
// default at every size, and a caller that builds in Client.Buffer and reads lent
// responses makes none. (A 16 MiB echo is left to BenchmarkLargeEcho: its clone makes a
// garbage collection run every call or two, whose refills of the server's pools add to the
// count.) Allocation counts, not times: the race detector's own allocations skip it.
func TestClientAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own: allocation counts are for the plain build")
	}
	for _, lent := range []bool{false, true} {
		var copts []rpc.DialOption
		if lent {
			copts = append(copts, rpc.WithLentResponses())
		}
		e := startLend(t, nil, copts...)
		ctx := context.Background()
		for _, n := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
			payload := pattern(n, 1)
			call := func() {
				req := payload
				if lent {
					var err error
					if req, err = e.client.Buffer(ctx, n); err != nil {
						t.Fatal(err)
					}
				}
				out, err := e.client.InvokeBytes(ctx, "/test.Raw/Echo", req)
				if err != nil || len(out) != n {
					t.Fatalf("%d bytes: %d back, %v", n, len(out), err)
				}
				if lent {
					if err := e.client.Release(out); err != nil {
						t.Fatal(err)
					}
				}
			}
			for range 20 { // warm: connections, lanes, pools, send slots grown
				call()
			}
			want := 1.0
			if lent {
				want = 0
			}
			if got := testing.AllocsPerRun(50, call); got > want+1 {
				t.Errorf("lent=%v, %d bytes: %.1f allocations per call (client and server), want about %.0f", lent, n, got, want)
			}
		}
	}
}

// TestLentSendsPerCall counts the SENDs of small calls from many callers at once: lending
// must not cost messages. A lent response holds its receive slot until Release, so the
// slot is reposted (and its credit returned) later than a copied one's; if held slots
// delayed the credits, each call would cost credit Releases of its own beside its request
// and response, and callers that keep their responses could stall the connection (the
// transport's TestHeldResponses). Rows: copied responses, lent ones released at once, and
// lent ones each caller keeps until its next call returns.
func TestLentSendsPerCall(t *testing.T) {
	const callers, calls, size = 64, 50, 64
	for _, mode := range []string{"copy", "lent", "held"} {
		t.Run(mode, func(t *testing.T) {
			var copts []rpc.DialOption
			if mode != "copy" {
				copts = append(copts, rpc.WithLentResponses())
			}
			e := startLend(t, nil, copts...)
			cs0, ss0 := e.client.Stats(), e.srv.Stats()
			var wg sync.WaitGroup
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := lentCalls(e.client, mode, calls, size); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			cs, ss := e.client.Stats(), e.srv.Stats()
			n := float64(callers * calls)
			cli, srv := float64(cs.Sends-cs0.Sends)/n, float64(ss.Sends-ss0.Sends)/n
			t.Logf("%s: %.3f SENDs per call from the client, %.3f from the server; %d responses copied out of their slots", mode, cli, srv, cs.Unshared-cs0.Unshared)
			if ss.Stalled != ss0.Stalled {
				t.Errorf("%s: %d connections stalled for credits on the server, want none", mode, ss.Stalled-ss0.Stalled)
			}
			// One request and one response each; the rest is credit Releases (about one per
			// Credits/8 messages received) and the odd ping.
			if cli > 1.1 || srv > 1.1 {
				t.Errorf("%s: %.3f SENDs per call from the client and %.3f from the server, want at most 1.1 each (a request or a response, and a credit Release per Credits/8 calls)", mode, cli, srv)
			}
		})
	}
}

// lentCalls makes calls Echo calls of size bytes: with the caller's own request and a
// copied response (mode copy), or in Buffer's memory with a lent response released at once
// (lent) or after the next call returns (held).
func lentCalls(c *rpc.Client, mode string, calls, size int) error {
	ctx := context.Background()
	payload := pattern(size, 3)
	var held []byte
	defer func() {
		if held != nil {
			_ = c.Release(held)
		}
	}()
	for range calls {
		req := payload
		if mode != "copy" {
			var err error
			if req, err = c.Buffer(ctx, size); err != nil {
				return err
			}
			copy(req, payload)
		}
		out, err := c.InvokeBytes(ctx, "/test.Raw/Echo", req)
		if err != nil {
			return err
		}
		if !bytes.Equal(out, payload) {
			return fmt.Errorf("%s: response differs from the request", mode)
		}
		switch mode {
		case "lent":
			err = c.Release(out)
		case "held":
			if held != nil {
				err = c.Release(held)
			}
			held = out
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// TestClientStreamBuffer: messages built in Client.Buffer's memory, inside a SEND and
// through windows, leave on a client stream from where they lie (the stream takes each
// buffer: Release of it fails), arrive intact, and leave no buffer behind; a message that
// starts elsewhere in a Buffer is copied and leaves the buffer lent; a Buffer sent on a
// stream that has ended is taken all the same.
func TestClientStreamBuffer(t *testing.T) {
	ctx := context.Background()
	e := startLend(t, nil)
	if _, err := e.client.InvokeBytes(ctx, "/test.Raw/Echo", []byte("warm")); err != nil {
		t.Fatal(err)
	}
	e.settled(t, "warm-up", inUse(e.client.Stats()), inUse(e.srv.Stats()))
	baseC, baseS := inUse(e.client.Stats()), inUse(e.srv.Stats())
	const msgs = 5
	for _, n := range []int{100, 200 << 10, 1 << 20} {
		cs, err := e.client.NewStream(ctx, "/test.Raw/Collect", nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range msgs {
			b, err := e.client.Buffer(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			copy(b, pattern(n, i))
			if err := cs.SendBytes(b); err != nil {
				t.Fatalf("%d bytes, message %d: %v", n, i, err)
			}
			if err := e.client.Release(b); rpc.CodeOf(err) != rpc.InvalidArgument {
				t.Fatalf("%d bytes: Release of a Buffer the stream sent: %v, want InvalidArgument (the stream took it)", n, err)
			}
		}
		if err := cs.CloseSend(); err != nil {
			t.Fatal(err)
		}
		reply, err := cs.RecvBytes()
		if want := fmt.Sprintf("%d messages, %d bytes", msgs, msgs*n); err != nil || string(reply) != want {
			t.Fatalf("%d bytes: reply %q, %v; want %q", n, reply, err, want)
		}
		if _, err := cs.RecvBytes(); err != io.EOF {
			t.Fatalf("%d bytes: after the reply: %v, want io.EOF", n, err)
		}
		e.settled(t, fmt.Sprintf("a stream of %d-byte Buffers", n), baseC, baseS)
	}

	cs, err := e.client.NewStream(ctx, "/test.Raw/Collect", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.client.Buffer(ctx, 200<<10)
	if err != nil {
		t.Fatal(err)
	}
	copy(b[1:], pattern(len(b)-1, 0))
	if err := cs.SendBytes(b[1:]); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Release(b); err != nil {
		t.Fatalf("Release of a Buffer sent from its second byte (copied, so still lent): %v", err)
	}
	cs.Close() // the server's handler sees its stream canceled
	b, err = e.client.Buffer(ctx, 200<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendBytes(b); err == nil {
		t.Fatal("a send on a closed stream succeeded")
	}
	if err := e.client.Release(b); rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Fatalf("Release of a Buffer a closed stream was given: %v, want InvalidArgument (taken all the same)", err)
	}
	e.settled(t, "a closed stream", baseC, baseS)
}
