package rpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
)

// headerSvc sets response headers: Unary sets some, sends more, then answers (or fails,
// when asked); Stream sets them and sends n messages (none: it fails after them).
type headerSvc struct{}

type headerReq struct {
	N    int
	Fail bool
	Big  int // bytes of a header value: past the eager limit, the header message is READ
}

func (headerSvc) unary(ctx context.Context, req *headerReq) (*headerReq, error) {
	if err := rpc.SetHeader(ctx, rpc.Pairs("set", "1", "Mixed-Case", "a")); err != nil {
		return nil, err
	}
	if err := rpc.SendHeader(ctx, rpc.Pairs("sent", "2")); err != nil {
		return nil, err
	}
	if err := rpc.SetHeader(ctx, rpc.Pairs("late", "3")); err == nil {
		return nil, errors.New("SetHeader after SendHeader succeeded")
	}
	_ = rpc.SetTrailer(ctx, rpc.Pairs("trailer", "t"))
	if req.Fail {
		return nil, rpc.Errorf(rpc.FailedPrecondition, "asked to fail")
	}
	return req, nil
}

func (headerSvc) stream(req *headerReq, ss *rpc.ServerStream) error {
	ctx := ss.Context()
	if err := rpc.SetHeader(ctx, rpc.Pairs("stream", "s", "big", strings.Repeat("b", req.Big))); err != nil {
		return err
	}
	for i := range req.N {
		if err := ss.SendMsg(&headerReq{N: i}); err != nil {
			return err
		}
		if i == 0 && rpc.SetHeader(ctx, rpc.Pairs("late", "x")) == nil {
			return errors.New("SetHeader after the first message succeeded")
		}
	}
	if req.N == 0 {
		return rpc.Errorf(rpc.Aborted, "no messages")
	}
	return nil
}

type headered interface {
	Unary(context.Context, *headerReq) (*headerReq, error)
}

var headerDesc = rpc.ServiceDesc{
	ServiceName: "test.Headers",
	HandlerType: (*headered)(nil),
	Methods: []rpc.MethodDesc{{MethodName: "Unary", Handler: func(srv any, ctx context.Context, dec func(any) error, _ rpc.UnaryServerInterceptor) (any, error) {
		in := new(headerReq)
		if err := dec(in); err != nil {
			return nil, err
		}
		return headerSvc{}.unary(ctx, in)
	}}},
	Streams: []rpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, Handler: func(srv any, ss *rpc.ServerStream) (any, error) {
		in := new(headerReq)
		if err := ss.Request(in); err != nil {
			return nil, err
		}
		return nil, headerSvc{}.stream(in, ss)
	}}},
}

func (headerSvc) Unary(ctx context.Context, req *headerReq) (*headerReq, error) {
	return headerSvc{}.unary(ctx, req)
}

func headerClient(t *testing.T) *rpc.Client {
	t.Helper()
	srv := rpc.NewServer()
	srv.RegisterService(&headerDesc, headerSvc{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestUnaryHeaders(t *testing.T) {
	leakcheck.Check(t)
	c := headerClient(t)
	want := rpc.MD{"set": {"1"}, "mixed-case": {"a"}, "sent": {"2"}}
	for _, fail := range []bool{false, true} {
		var header, trailer rpc.MD
		err := c.Invoke(context.Background(), "/test.Headers/Unary", &headerReq{Fail: fail}, new(headerReq), rpc.Header(&header), rpc.Trailer(&trailer))
		if (err != nil) != fail || fail && !errors.Is(err, rpc.ErrFailedPrecondition) {
			t.Fatalf("fail=%v: %v", fail, err)
		}
		if !reflect.DeepEqual(header, want) || !reflect.DeepEqual(trailer, rpc.MD{"trailer": {"t"}}) {
			t.Errorf("fail=%v: header %v, trailer %v; want %v and the trailer apart", fail, header, trailer, want)
		}
	}
	if err := rpc.SetHeader(context.Background(), rpc.Pairs("k", "v")); rpc.CodeOf(err) != rpc.Internal {
		t.Errorf("SetHeader outside a handler: %v", err)
	}
}

func TestStreamHeaders(t *testing.T) {
	leakcheck.Check(t)
	c := headerClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name   string
		req    headerReq
		endErr error
	}{
		{"ahead of the messages", headerReq{N: 3}, io.EOF},
		{"read through a window", headerReq{N: 2, Big: 200 << 10}, io.EOF},
		{"with the end, no messages", headerReq{N: 0}, rpc.ErrAborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var atEnd rpc.MD
			cs, err := c.NewStream(ctx, "/test.Headers/Stream", &tc.req, rpc.Header(&atEnd))
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			want := rpc.MD{"stream": {"s"}, "big": {strings.Repeat("b", tc.req.Big)}}
			h, err := cs.Header()
			if err != nil || !reflect.DeepEqual(h, want) {
				t.Fatalf("Header before any message: %d keys, %v", len(h), err)
			}
			n := 0
			for {
				err = cs.RecvMsg(new(headerReq))
				if err != nil {
					break
				}
				n++
			}
			if n != tc.req.N || !errors.Is(err, tc.endErr) {
				t.Errorf("%d messages, then %v; want %d, then %v", n, err, tc.req.N, tc.endErr)
			}
			if !reflect.DeepEqual(atEnd, want) {
				t.Errorf("the Header call option: %d keys", len(atEnd))
			}
		})
	}
	// Receiving without asking for the header first skips it.
	cs, err := c.NewStream(ctx, "/test.Headers/Stream", &headerReq{N: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var got headerReq
	if err := cs.RecvMsg(&got); err != nil || got.N != 0 {
		t.Fatalf("first message: %+v %v", got, err)
	}
	if h, err := cs.Header(); err != nil || h["stream"][0] != "s" {
		t.Errorf("Header after the first message: %v %v", h, err)
	}
}
