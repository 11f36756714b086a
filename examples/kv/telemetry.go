package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// setupTelemetry installs the OpenTelemetry SDK as the global providers, as a service
// would in its main: mwrpc then traces and times every call with no option of its own.
// "stdout" exports spans and metrics as JSON to w (spans as they end, metrics at
// shutdown); "" and "off" install nothing. The returned function flushes and shuts down.
func setupTelemetry(mode string, w io.Writer) (func(context.Context) error, error) {
	switch mode {
	case "", "off":
		return func(context.Context) error { return nil }, nil
	case "stdout":
	default:
		return nil, fmt.Errorf("-telemetry %q: want stdout or off", mode)
	}
	spans, err := stdouttrace.New(stdouttrace.WithWriter(w), stdouttrace.WithPrettyPrint())
	if err != nil {
		return nil, err
	}
	metrics, err := stdoutmetric.New(stdoutmetric.WithWriter(w), stdoutmetric.WithPrettyPrint())
	if err != nil {
		return nil, err
	}
	// Spans leave synchronously so that each process prints its own as they end; the
	// sampler follows the caller's decision and leaves out the calls runClient marks quiet
	// (the bulk loads and the latency loop), so the output stays readable.
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(spans),
		sdktrace.WithSampler(sdktrace.ParentBased(quietSampler{})))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(
		sdkmetric.NewPeriodicReader(metrics, sdkmetric.WithInterval(time.Hour))))
	flushMetrics = func() { _ = mp.ForceFlush(context.Background()) }
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}, nil
}

// flushMetrics exports the metrics now: called before a client or server closes, while
// its transport's instruments are still registered.
var flushMetrics = func() {}

// quietKey marks a context whose calls are not traced.
type quietKey struct{}

// quiet returns ctx with its calls left out of the trace output.
func quiet(ctx context.Context) context.Context { return context.WithValue(ctx, quietKey{}, true) }

// quietSampler samples every root span but those started under quiet.
type quietSampler struct{}

func (quietSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	d := sdktrace.RecordAndSample
	if q, _ := p.ParentContext.Value(quietKey{}).(bool); q {
		d = sdktrace.Drop
	}
	return sdktrace.SamplingResult{Decision: d, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (quietSampler) Description() string { return "QuietSampler" }
