package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/mwnet"
)

func TestMain(m *testing.M) {
	// gRPC's interop cases report a failure with grpclog's Fatal, which exits the process;
	// this logger panics instead, and each case turns the panic into its test's failure.
	grpclog.SetLoggerV2(fatalPanics{grpclog.NewLoggerV2(io.Discard, os.Stderr, os.Stderr)})
	os.Exit(leakcheck.Main(m))
}

// fatalPanics is a grpclog.LoggerV2 whose Fatal family panics with the message.
type fatalPanics struct{ grpclog.LoggerV2 }

type interopFailure string

func (fatalPanics) Fatal(args ...any)   { panic(interopFailure(fmt.Sprint(args...))) }
func (fatalPanics) Fatalln(args ...any) { panic(interopFailure(fmt.Sprintln(args...))) }
func (fatalPanics) Fatalf(format string, args ...any) {
	panic(interopFailure(fmt.Sprintf(format, args...)))
}

// interopCases are gRPC-Go's own interop cases (google.golang.org/grpc/interop), by the
// names of gRPC's interop test descriptions.
var interopCases = []struct {
	name string
	run  func(context.Context, testgrpc.TestServiceClient, *grpc.ClientConn)
}{
	{"empty_unary", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoEmptyUnaryCall(ctx, tc)
	}},
	{"large_unary", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoLargeUnaryCall(ctx, tc)
	}},
	{"client_streaming", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoClientStreaming(ctx, tc)
	}},
	{"server_streaming", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoServerStreaming(ctx, tc)
	}},
	{"ping_pong", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoPingPong(ctx, tc)
	}},
	{"empty_stream", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoEmptyStream(ctx, tc)
	}},
	{"timeout_on_sleeping_server", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoTimeoutOnSleepingServer(ctx, tc)
	}},
	{"cancel_after_begin", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoCancelAfterBegin(ctx, tc)
	}},
	{"cancel_after_first_response", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoCancelAfterFirstResponse(ctx, tc)
	}},
	{"custom_metadata", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoCustomMetadata(ctx, tc)
	}},
	{"status_code_and_message", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoStatusCodeAndMessage(ctx, tc)
	}},
	{"special_status_message", func(ctx context.Context, tc testgrpc.TestServiceClient, _ *grpc.ClientConn) {
		interop.DoSpecialStatusMessage(ctx, tc)
	}},
	{"unimplemented_method", func(ctx context.Context, _ testgrpc.TestServiceClient, cc *grpc.ClientConn) {
		interop.DoUnimplementedMethod(ctx, cc)
	}},
}

// TestInterop runs every interop case over mwnet, on the soft TCP fabric and on shm.
func TestInterop(t *testing.T) {
	targets := []struct{ name, target string }{{"tcp", "127.0.0.1:0"}}
	if runtime.GOOS == "linux" {
		targets = append(targets, struct{ name, target string }{"shm", "shm://" + filepath.Join(t.TempDir(), "grpc.sock")})
	} else {
		t.Log("shm fabric: Linux only, not run on " + runtime.GOOS)
	}
	for _, fabric := range targets {
		t.Run(fabric.name, func(t *testing.T) { runInterop(t, fabric.name, fabric.target, nil, nil) })
	}
}

// runInterop serves the TestService at target (with the listener's options), dials it
// (with the dialer's) and runs every interop case as a subtest.
func runInterop(t *testing.T, fabric, target string, listen, dial []mwnet.Option) {
	leakcheck.Check(t)
	addr, stop, err := Serve(target, listen...)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cc, err := NewClient(addr, dial...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	tc := testgrpc.NewTestServiceClient(cc)
	for _, c := range interopCases {
		t.Run(c.name, func(t *testing.T) {
			if msg := runCase(func(ctx context.Context) { c.run(ctx, tc, cc) }); msg != "" {
				t.Fatalf("%s over mwnet (%s): %s", c.name, fabric, msg)
			}
		})
	}
}

// runCase runs one interop case and returns its failure message, or "".
func runCase(run func(context.Context)) (failure string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			msg, ok := r.(interopFailure)
			if !ok {
				panic(r)
			}
			failure = string(msg)
		}
	}()
	run(ctx)
	return ""
}

// TestInteropCanFail: a case against a server that is gone is reported as a failure (the
// harness above does not pass what it cannot check).
func TestInteropCanFail(t *testing.T) {
	leakcheck.Check(t)
	addr, stop, err := Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	cc, err := NewClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	tc := testgrpc.NewTestServiceClient(cc)
	if msg := runCase(func(ctx context.Context) { interop.DoEmptyUnaryCall(ctx, tc) }); msg == "" {
		t.Fatal("empty_unary against a stopped server passed")
	} else {
		t.Logf("reported as expected: %s", msg)
	}
}
