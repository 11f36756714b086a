package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
)

// detailed fails every call with a status carrying one detail of each common kind and
// one the caller does not know, wrapped (Wrap) or not.
type detailed interface {
	Fail(ctx context.Context, req *headerReq) (*headerReq, error)
}

func failWithDetails(wrap bool) error {
	st, err := rpc.NewStatus(rpc.InvalidArgument, "bad request").WithDetails(
		&rpc.RetryInfo{RetryDelay: 1500 * time.Millisecond},
		&rpc.BadRequest{FieldViolations: []rpc.FieldViolation{{Field: "Key", Description: "empty"}, {Field: "Items[2]", Description: "too long"}}},
		&rpc.ErrorInfo{Reason: "KEY_EMPTY", Domain: "kv.example.com", Metadata: map[string]string{"limit": "0"}},
		&rpc.RawDetail{Type: "acme.Unknown", Value: []byte{0x91, 0x01}},
	)
	if err != nil {
		return err
	}
	if wrap {
		return fmt.Errorf("checking the request: %w", st)
	}
	return st
}

var detailedDesc = rpc.ServiceDesc{
	ServiceName: "test.Detailed",
	HandlerType: (*detailed)(nil),
	Methods: []rpc.MethodDesc{{MethodName: "Fail", Handler: func(srv any, ctx context.Context, dec func(any) error, _ rpc.UnaryServerInterceptor) (any, error) {
		in := new(headerReq)
		if err := dec(in); err != nil {
			return nil, err
		}
		return nil, failWithDetails(in.Fail)
	}}},
	Streams: []rpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, Handler: func(srv any, ss *rpc.ServerStream) (any, error) {
		if err := ss.SendMsg(&headerReq{N: 1}); err != nil {
			return nil, err
		}
		return nil, failWithDetails(false)
	}}},
}

type detailedImpl struct{}

func (detailedImpl) Fail(context.Context, *headerReq) (*headerReq, error) { return nil, nil }

// checkDetails checks that err is the InvalidArgument status with the four details.
func checkDetails(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, rpc.ErrInvalidArgument) || rpc.CodeOf(err) != rpc.InvalidArgument {
		t.Fatalf("%v: want InvalidArgument", err)
	}
	ri, ok := rpc.DetailOf[*rpc.RetryInfo](err)
	if !ok || ri.RetryDelay != 1500*time.Millisecond {
		t.Errorf("RetryInfo: %+v %v", ri, ok)
	}
	br, ok := rpc.DetailOf[*rpc.BadRequest](err)
	if !ok || len(br.FieldViolations) != 2 || br.FieldViolations[1] != (rpc.FieldViolation{Field: "Items[2]", Description: "too long"}) {
		t.Errorf("BadRequest: %+v %v", br, ok)
	}
	ei, ok := rpc.DetailOf[*rpc.ErrorInfo](err)
	if !ok || ei.Reason != "KEY_EMPTY" || ei.Domain != "kv.example.com" || !reflect.DeepEqual(ei.Metadata, map[string]string{"limit": "0"}) {
		t.Errorf("ErrorInfo: %+v %v", ei, ok)
	}
	raw, ok := rpc.DetailOf[*rpc.RawDetail](err)
	if !ok || raw.Type != "acme.Unknown" || string(raw.Value) != "\x91\x01" {
		t.Errorf("an unknown detail: %+v %v", raw, ok)
	}
	var st *rpc.Status
	if !errors.As(err, &st) || len(st.Details()) != 4 {
		t.Errorf("errors.As: %v, %d details", st, len(st.Details()))
	}
}

func TestStatusDetails(t *testing.T) {
	leakcheck.Check(t)
	srv := rpc.NewServer()
	srv.RegisterService(&detailedDesc, detailedImpl{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, wrap := range []bool{false, true} {
		checkDetails(t, c.Invoke(ctx, "/test.Detailed/Fail", &headerReq{Fail: wrap}, new(headerReq)))
	}
	cs, err := c.NewStream(ctx, "/test.Detailed/Stream", &headerReq{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if err := cs.RecvMsg(new(headerReq)); err != nil {
		t.Fatal(err)
	}
	checkDetails(t, cs.RecvMsg(new(headerReq)))

	// The status the handler made is the caller's too: details survive a local status.
	checkDetails(t, failWithDetails(true))
}

type notRegistered struct{ X int }

func TestWithDetailsRefuses(t *testing.T) {
	st := rpc.NewStatus(rpc.Internal, "x")
	if _, err := st.WithDetails(&notRegistered{}); err == nil || !strings.Contains(err.Error(), "*rpc_test.notRegistered is not a registered detail type") {
		t.Errorf("an unregistered type: %v", err)
	}
	many := make([]any, 65)
	for i := range many {
		many[i] = &rpc.RetryInfo{}
	}
	if _, err := st.WithDetails(many...); err == nil {
		t.Error("65 details were accepted")
	}
	if _, err := st.WithDetails(&rpc.ErrorInfo{Reason: strings.Repeat("x", 70<<10)}); err == nil {
		t.Error("70 KiB of details were accepted")
	}
	if len(st.Details()) != 0 {
		t.Error("WithDetails changed the status it was called on")
	}
	defer func() {
		if recover() == nil {
			t.Error("RegisterDetail of a non-pointer did not panic")
		}
	}()
	rpc.RegisterDetail[notRegistered]("test.NotAPointer")
}
