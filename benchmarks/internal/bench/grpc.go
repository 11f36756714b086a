package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"

	"github.com/mwrpc/mwrpc/benchmarks/internal/echo"
)

// rawCodec is a gRPC codec for []byte messages: no protobuf, so gRPC-Go is measured on the
// same payloads as mwrpc's raw codec. It is registered under its name, which the client
// sends as the content-subtype and the server looks up.
type rawCodec struct{}

const rawCodecName = "mwrpcbench-raw"

func init() { encoding.RegisterCodec(rawCodec{}) }

func (rawCodec) Name() string { return rawCodecName }

// Marshal returns the bytes themselves: gRPC only reads them.
func (rawCodec) Marshal(v any) ([]byte, error) {
	switch v := v.(type) {
	case []byte:
		return v, nil
	case *[]byte:
		return *v, nil
	}
	return nil, fmt.Errorf("mwrpcbench-raw codec: cannot marshal %T", v)
}

// Unmarshal keeps data without a copy: gRPC-Go hands a v1 codec a freshly materialized
// slice of its own (codecV0Bridge.Unmarshal), so it is the caller's to keep.
func (rawCodec) Unmarshal(data []byte, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("mwrpcbench-raw codec: cannot unmarshal into %T", v)
	}
	*p = data
	return nil
}

// grpcEchoDesc is what protoc-gen-go-grpc would write for service Bench, by hand: one
// unary method on []byte, served by the same echo.Server mwrpc serves.
var grpcEchoDesc = grpc.ServiceDesc{
	ServiceName: "bench.Bench",
	HandlerType: (*echo.Bench)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Echo", Handler: grpcEchoHandler}},
	Metadata:    "mwrpcbench",
}

const grpcEchoMethod = "/bench.Bench/Echo"

func grpcEchoHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	var in []byte
	if err := dec(&in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(echo.Bench).Echo(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: grpcEchoMethod}
	handler := func(ctx context.Context, req any) (any, error) {
		return srv.(echo.Bench).Echo(ctx, req.([]byte))
	}
	return interceptor(ctx, in, info, handler)
}

// grpcMaxMessage lifts gRPC's 4 MiB default receive limit above the largest payload.
const grpcMaxMessage = 64 << 20

// grpcServer is a grpc.Server serving echo.Bench.
type grpcServer struct {
	srv    *grpc.Server
	served chan error
}

func serveGRPC(ln net.Listener) (Server, error) { return serveGRPCWith(ln) }

// serveGRPCWith is serveGRPC with more server options (grpc-mwnet's buffers).
func serveGRPCWith(ln net.Listener, opts ...grpc.ServerOption) (Server, error) {
	g := &grpcServer{served: make(chan error, 1)}
	opts = append(opts, grpc.MaxRecvMsgSize(grpcMaxMessage), grpc.MaxSendMsgSize(grpcMaxMessage))
	g.srv = grpc.NewServer(opts...)
	g.srv.RegisterService(&grpcEchoDesc, echo.Server{})
	go func() { g.served <- g.srv.Serve(ln) }()
	return g, nil
}

func (g *grpcServer) Copied() (uint64, bool) { return 0, false }

func (g *grpcServer) Close() error {
	g.srv.Stop()
	if err := <-g.served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// grpcInstance is one grpc.ClientConn (one HTTP/2 connection) that all workers share, as
// mwrpc's workers share one rpc.Client.
type grpcInstance struct {
	conn *grpc.ClientConn
	req  []byte
	out  [][]byte // per worker
}

func dialGRPC(addr string, size, concurrency int) (Instance, error) {
	return dialGRPCWith(addr, size, concurrency)
}

// dialGRPCWith dials a gRPC-Go client to target with extra dial options (the fabric's
// dialer, buffer sizes) and makes one call, so that the connection is up before anything
// is measured.
func dialGRPCWith(target string, size, concurrency int, extra ...grpc.DialOption) (Instance, error) {
	g := &grpcInstance{req: payload(size), out: make([][]byte, concurrency)}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(rawCodecName),
			grpc.MaxCallRecvMsgSize(grpcMaxMessage), grpc.MaxCallSendMsgSize(grpcMaxMessage)),
	}, extra...)
	var err error
	if g.conn, err = grpc.NewClient(target, opts...); err != nil {
		return nil, fmt.Errorf("grpc.NewClient: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = g.conn.Invoke(ctx, grpcEchoMethod, &g.req, &g.out[0], grpc.WaitForReady(true))
	cancel()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("first call: %w", err), g.conn.Close())
	}
	return g, nil
}

func (g *grpcInstance) Call(w int) error {
	if err := g.conn.Invoke(context.Background(), grpcEchoMethod, &g.req, &g.out[w]); err != nil {
		return err
	}
	return checkLen("grpc", len(g.out[w]), len(g.req))
}

func (g *grpcInstance) Copied() (uint64, bool) { return 0, false }

func (g *grpcInstance) Close() error { return g.conn.Close() }
