// Command otlp shows mwrpc's telemetry wired the way production does it: the OpenTelemetry
// SDK with OTLP/HTTP exporters (to an OpenTelemetry Collector, Jaeger or anything else
// that speaks OTLP), installed as the global providers; mwrpc needs no option of its own.
// It serves the KV example in this process, makes a few calls and exits, flushing spans
// and metrics on the way out.
//
//	go run . -endpoint localhost:4318   # a collector's OTLP/HTTP port
//
// It is a module of its own so that the OTLP exporters (and the gRPC modules they
// require) never enter the library's go.mod.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/mwrpc/mwrpc/examples/kv/kvservice"
	"github.com/mwrpc/mwrpc/rpc"
)

func main() {
	endpoint := flag.String("endpoint", "localhost:4318", "the collector's OTLP/HTTP host:port")
	flag.Parse()
	if err := run(context.Background(), *endpoint); err != nil {
		log.Fatal(err)
	}
}

// run installs the SDK exporting to endpoint (plain HTTP), serves KV, calls it and shuts
// the SDK down, which exports what is left.
func run(ctx context.Context, endpoint string) (err error) {
	shutdown, err := installSDK(ctx, endpoint)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, shutdown(context.Background())) }()

	srv := rpc.NewServer()
	kvservice.RegisterKV(srv, kvservice.NewStore())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go srv.Serve(ln)
	defer srv.GracefulStop()
	client, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		return err
	}
	defer client.Close()
	kv := kvservice.NewKVClient(client)
	big := bytes.Repeat([]byte("otlp "), 1<<18)
	if _, err := kv.Put(ctx, &kvservice.PutRequest{Key: "big", Value: big}); err != nil {
		return err
	}
	if _, err := kv.Get(ctx, &kvservice.GetRequest{Key: "big"}); err != nil {
		return err
	}
	if _, err := kv.Get(ctx, &kvservice.GetRequest{Key: "missing"}); !errors.Is(err, rpc.ErrNotFound) {
		return fmt.Errorf("get missing: %v, want NotFound", err)
	}
	// Export the transport's instruments while client and server are still open.
	if mp, ok := otel.GetMeterProvider().(*sdkmetric.MeterProvider); ok {
		return mp.ForceFlush(ctx)
	}
	return nil
}

// installSDK sets the global tracer and meter providers (OTLP/HTTP, batched) and the W3C
// propagators, and returns what shuts them down.
func installSDK(ctx context.Context, endpoint string) (func(context.Context) error, error) {
	res := resource.NewSchemaless(semconv.ServiceName("mwrpc-otlp-example"))
	te, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(endpoint), otlptracehttp.WithInsecure())
	if err != nil {
		return nil, err
	}
	me, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpoint(endpoint), otlpmetrichttp.WithInsecure())
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(te), sdktrace.WithResource(res))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(me)), sdkmetric.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func(ctx context.Context) error { return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx)) }, nil
}
