package rpc_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/internal/benchsvc"
	"github.com/mwrpc/mwrpc/transport/credentials"
)

// BenchmarkStubs calls through generated stubs over the soft TCP fabric: a small struct
// (msgpack) and []byte payloads of 64 B and 1 MiB (the raw codec), at concurrency 1 and 32.
// Client and server run in one process, so allocs/op counts both sides.
//
//	go test -run '^$' -bench Stubs -benchmem -count 5 ./rpc/
func BenchmarkStubs(b *testing.B) {
	srv := rpc.NewServer()
	benchsvc.RegisterBench(srv, benchsvc.Echo{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	client, err := rpc.Dial(context.Background(), ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	svc := benchsvc.NewBenchClient(client)
	small := &benchsvc.Small{Key: "user:1234", Value: bytes.Repeat([]byte{7}, 64), Version: 42}
	cases := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"struct", func(ctx context.Context) error { _, err := svc.Small(ctx, small); return err }},
	}
	for _, n := range []int{64, 1 << 20} {
		payload := bytes.Repeat([]byte{1}, n)
		cases = append(cases, struct {
			name string
			call func(ctx context.Context) error
		}{fmt.Sprintf("bytes%d", n), func(ctx context.Context) error {
			out, err := svc.Bytes(ctx, payload)
			if err == nil && len(out) != n {
				err = fmt.Errorf("%d bytes back", len(out))
			}
			return err
		}})
	}
	for _, tc := range cases {
		for _, conc := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/c%d", tc.name, conc), func(b *testing.B) {
				ctx := context.Background()
				for i := 0; i < 20; i++ {
					if err := tc.call(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				if conc == 1 {
					for i := 0; i < b.N; i++ {
						if err := tc.call(ctx); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(conc / 2)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := tc.call(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkTelemetry prices the instrumentation on the 64 B call (generated stubs, soft
// TCP fabric, concurrency 1): off (WithoutTelemetry), on with the default global providers
// and no SDK (what every user gets), and on with the SDK, a sampler that drops every span,
// metrics into a manual reader and the W3C propagators (trace context still travels).
// allocs/op counts client and server together.
//
//	go test -run '^$' -bench Telemetry -benchmem -count 6 ./rpc/
func BenchmarkTelemetry(b *testing.B) {
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	sdk := func() []rpc.Option {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		return []rpc.Option{rpc.WithTracerProvider(tp), rpc.WithMeterProvider(mp), rpc.WithPropagators(prop)}
	}
	for _, mode := range []struct {
		name string
		opts func() []rpc.Option
	}{
		{"off", func() []rpc.Option { return []rpc.Option{rpc.WithoutTelemetry()} }},
		{"global-noop", func() []rpc.Option { return nil }},
		{"sdk-drop-all", sdk},
	} {
		b.Run(mode.name, func(b *testing.B) {
			var sopts []rpc.ServerOption
			var copts []rpc.DialOption
			for _, o := range mode.opts() {
				sopts, copts = append(sopts, o), append(copts, o)
			}
			timeEcho(b, benchClient(b, sopts, copts), 64)
		})
	}
}

// BenchmarkTLS prices transport credentials on the soft TCP fabric, where TLS carries
// every message: 64 B and 1 MiB echoes through generated stubs, plaintext against mutual
// TLS 1.3 (AES-GCM or ChaCha20 as the CPU suits), concurrency 1, client and server in one
// process.
//
//	go test -run '^$' -bench TLS -benchmem -count 6 ./rpc/
func BenchmarkTLS(b *testing.B) {
	ca := newCA(b, "bench CA")
	serverCreds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.issue(b, "server", true)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool})
	clientCreds := credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{ca.issue(b, "client", false)}})
	for _, n := range []int{64, 1 << 20} {
		for _, mode := range []string{"plain", "tls"} {
			b.Run(fmt.Sprintf("%s/%dB", mode, n), func(b *testing.B) {
				var sopts []rpc.ServerOption
				var copts []rpc.DialOption
				if mode == "tls" {
					sopts, copts = append(sopts, rpc.WithTransportCredentials(serverCreds)), append(copts, rpc.WithTransportCredentials(clientCreds))
				}
				b.SetBytes(int64(2 * n))
				timeEcho(b, benchClient(b, sopts, copts), n)
			})
		}
	}
}

// benchClient serves benchsvc on a loopback port with sopts and returns a client of it
// dialed with copts; both stop at the benchmark's cleanup.
func benchClient(b *testing.B, sopts []rpc.ServerOption, copts []rpc.DialOption) *benchsvc.BenchClient {
	b.Helper()
	srv := rpc.NewServer(sopts...)
	benchsvc.RegisterBench(srv, benchsvc.Echo{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(srv.Stop)
	client, err := rpc.Dial(context.Background(), ln.Addr().String(), copts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close() })
	return benchsvc.NewBenchClient(client)
}

// timeEcho echoes n bytes b.N times, one call at a time, after a warm-up, and reports
// allocations and the median latency (p50-ns).
func timeEcho(b *testing.B, svc *benchsvc.BenchClient, n int) {
	payload := bytes.Repeat([]byte{1}, n)
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if _, err := svc.Bytes(ctx, payload); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	lat := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := svc.Bytes(ctx, payload); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
}

// BenchmarkRefuseOverLimit prices refusing a 200 MiB request over the default 64 MiB
// maximum message size: raw bytes (refused by their length) and a msgpack struct (refused
// as soon as its encoding passes the limit, before the large field is copied).
//
//	go test -run '^$' -bench RefuseOverLimit ./rpc/
func BenchmarkRefuseOverLimit(b *testing.B) {
	svc := benchClient(b, nil, nil)
	huge := make([]byte, 200<<20)
	ctx := context.Background()
	b.Run("bytes", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := svc.Bytes(ctx, huge); !errors.Is(err, rpc.ErrResourceExhausted) {
				b.Fatal(err)
			}
		}
	})
	b.Run("msgpack", func(b *testing.B) {
		req := &benchsvc.Small{Key: "k", Value: huge}
		for i := 0; i < b.N; i++ {
			if _, err := svc.Small(ctx, req); !errors.Is(err, rpc.ErrResourceExhausted) {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLargeEcho prices payloads from 64 B to 16 MiB through generated stubs over the
// soft TCP fabric, one call at a time: "copy" passes a heap []byte and gets the caller's
// own copy back (the default); "lent" builds each request in Client.Buffer's memory and
// reads the response where the transport put it (WithLentResponses), giving it back with
// Client.Release. Client and server run in one process, so allocs/op counts both sides:
// the client's alone is at most that.
//
//	go test -run '^$' -bench LargeEcho -benchmem -count 3 ./rpc/
func BenchmarkLargeEcho(b *testing.B) {
	for _, mode := range []string{"copy", "lent"} {
		e := newEchoBench(b, mode)
		for _, n := range []int{64, 4 << 10, 64 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("%s/%s", mode, sizeName(n)), func(b *testing.B) {
				call := e.caller(n)
				e.warm(b, call)
				b.SetBytes(int64(2 * n))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := call(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		e.stop()
	}
}

// echoBench is a server and a Client over the soft TCP fabric for the echo benchmarks, in
// one of their modes: "copy" (the default client) or "lent" (WithLentResponses, requests
// built in Client.Buffer).
type echoBench struct {
	mode   string
	srv    *rpc.Server
	client *rpc.Client
	svc    *benchsvc.BenchClient
}

func newEchoBench(b *testing.B, mode string) *echoBench {
	var copts []rpc.DialOption
	if mode == "lent" {
		copts = append(copts, rpc.WithLentResponses())
	}
	e := &echoBench{mode: mode, srv: rpc.NewServer()}
	benchsvc.RegisterBench(e.srv, benchsvc.Echo{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go e.srv.Serve(ln)
	if e.client, err = rpc.Dial(context.Background(), ln.Addr().String(), copts...); err != nil {
		b.Fatal(err)
	}
	e.svc = benchsvc.NewBenchClient(e.client)
	return e
}

// caller returns one echo call of n bytes in e's mode, checking the length that came back.
func (e *echoBench) caller(n int) func(context.Context) error {
	payload := bytes.Repeat([]byte{1}, n)
	return func(ctx context.Context) error {
		req := payload
		var err error
		if e.mode == "lent" {
			if req, err = e.client.Buffer(ctx, n); err != nil {
				return err
			}
		}
		out, err := e.svc.Bytes(ctx, req)
		if err == nil && len(out) != n {
			err = fmt.Errorf("%d bytes back", len(out))
		}
		if err == nil && e.mode == "lent" {
			err = e.client.Release(out)
		}
		return err
	}
}

// warm makes ten calls before the timer starts.
func (e *echoBench) warm(b *testing.B, call func(context.Context) error) {
	for i := 0; i < 10; i++ {
		if err := call(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

func (e *echoBench) stop() {
	e.client.Close()
	e.srv.Stop()
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkLentParallel is BenchmarkLargeEcho's copy and lent modes for small payloads
// under many callers (64 B and 4 KiB, 16 and 64 callers sharing one Client over the soft
// TCP fabric): what lending costs when every caller borrows and gives back at once. Run it
// with GOMAXPROCS of a real machine to see the client's shared state contended, and with
// -mutexprofile to see where:
//
//	go test -run '^$' -bench LentParallel -benchmem -cpu 8 -mutexprofile mutex.out ./rpc/
func BenchmarkLentParallel(b *testing.B) {
	for _, mode := range []string{"copy", "lent"} {
		e := newEchoBench(b, mode)
		for _, n := range []int{64, 4 << 10} {
			call := e.caller(n)
			for _, conc := range []int{16, 64} {
				b.Run(fmt.Sprintf("%s/%s/c%d", mode, sizeName(n), conc), func(b *testing.B) {
					e.warm(b, call)
					b.ReportAllocs()
					b.ResetTimer()
					b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := call(context.Background()); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
		}
		e.stop()
	}
}
