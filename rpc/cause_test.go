package rpc_test

import (
	"context"
	"errors"
	"iter"
	"net"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// producer is a server-streaming service whose iterator reports, when its yield returns
// false, what rpc.Cause and ctx.Err() said.
type producer struct{ ended chan [2]error }

type produced interface {
	Blobs(ctx context.Context, size *int) iter.Seq2[[]byte, error]
}

func (p producer) Blobs(ctx context.Context, size *int) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		for i := 0; ; i++ {
			if !yield(make([]byte, *size), nil) {
				p.ended <- [2]error{rpc.Cause(ctx), ctx.Err()}
				return
			}
		}
	}
}

var producerDesc = rpc.ServiceDesc{
	ServiceName: "test.Producer",
	HandlerType: (*produced)(nil),
	Streams: []rpc.StreamDesc{{StreamName: "Blobs", ServerStreams: true, Handler: func(srv any, stream *rpc.ServerStream) (any, error) {
		size := new(int)
		if err := stream.Request(size); err != nil {
			return nil, err
		}
		return nil, rpc.SendAll(stream, srv.(produced).Blobs(stream.Context(), size))
	}}},
}

// TestCauseAfterYieldFalse: a producer whose yield returned false learns why from
// rpc.Cause, also when its context is not done (a message over the size limit).
func TestCauseAfterYieldFalse(t *testing.T) {
	leakcheck.Check(t)
	p := producer{ended: make(chan [2]error, 1)}
	srv := rpc.NewServer(rpc.WithTransport(transport.Config{MaxMessage: 1 << 20}))
	srv.RegisterService(&producerDesc, p)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	blobs := func(size int) iter.Seq2[[]byte, error] {
		return rpc.ServerStreamCall(ctx, c, "/test.Producer/Blobs", &size, rpc.RecvBytes)
	}

	n := 0
	for _, err := range blobs(10) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 2 {
			break // cancels the call
		}
	}
	got := <-p.ended
	if !errors.Is(got[0], rpc.ErrCanceled) {
		t.Errorf("after the caller broke out of its loop: Cause %v (ctx.Err() %v); want Canceled", got[0], got[1])
	}

	for _, err := range blobs(2 << 20) {
		if !errors.Is(err, rpc.ErrResourceExhausted) {
			t.Errorf("a message over the limit: the caller got %v; want ResourceExhausted", err)
		}
	}
	got = <-p.ended
	if !errors.Is(got[0], rpc.ErrResourceExhausted) || got[1] != nil {
		t.Errorf("a message over the limit: Cause %v, ctx.Err() %v; want ResourceExhausted while the context lives", got[0], got[1])
	}

	if err := rpc.Cause(ctx); err != nil {
		t.Errorf("Cause of a live context that is no handler's: %v", err)
	}
	cctx, ccancel := context.WithCancelCause(context.Background())
	boom := errors.New("boom")
	ccancel(boom)
	if err := rpc.Cause(cctx); err != boom {
		t.Errorf("Cause of a context canceled with a cause: %v; want that cause", err)
	}
}

func TestSlice(t *testing.T) {
	var got []int
	for v, err := range rpc.Slice([]int{1, 2, 3}) {
		if err != nil {
			t.Fatal(err)
		}
		if got = append(got, v); len(got) == 2 {
			break // the iterator stops when the loop does
		}
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("Slice: %v", got)
	}
	for range rpc.Slice[int](nil) {
		t.Error("Slice(nil) yielded")
	}
}
