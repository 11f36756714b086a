package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mwrpc/mwrpc/rpc"
)

// telemetryEnv is a server and a client, each with its own in-memory span recorder and
// manual metric reader, and a server interceptor that records what handlers see.
type telemetryEnv struct {
	*env
	clientSpans, serverSpans     *tracetest.SpanRecorder
	clientMetrics, serverMetrics *sdkmetric.ManualReader

	mu      sync.Mutex
	seen    trace.SpanContext // the span in the last handler's context
	baggage string            // the baggage member "tenant" the last handler saw
}

func startTelemetry(t *testing.T) *telemetryEnv {
	te := &telemetryEnv{
		clientSpans: tracetest.NewSpanRecorder(), serverSpans: tracetest.NewSpanRecorder(),
		clientMetrics: sdkmetric.NewManualReader(), serverMetrics: sdkmetric.NewManualReader(),
	}
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	ctp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(te.clientSpans))
	stp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(te.serverSpans))
	cmp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(te.clientMetrics))
	smp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(te.serverMetrics))
	t.Cleanup(func() {
		for _, f := range []func(context.Context) error{ctp.Shutdown, stp.Shutdown, cmp.Shutdown, smp.Shutdown} {
			if err := f(context.Background()); err != nil {
				t.Error(err)
			}
		}
	})
	see := func(ctx context.Context, req any, info *rpc.UnaryServerInfo, h rpc.UnaryHandler) (any, error) {
		te.mu.Lock()
		te.seen = trace.SpanContextFromContext(ctx)
		te.baggage = baggage.FromContext(ctx).Member("tenant").Value()
		te.mu.Unlock()
		return h(ctx, req)
	}
	te.env = start(t,
		[]rpc.ServerOption{rpc.WithTracerProvider(stp), rpc.WithMeterProvider(smp), rpc.WithPropagators(prop), rpc.WithUnaryInterceptor(see)},
		rpc.WithTracerProvider(ctp), rpc.WithMeterProvider(cmp), rpc.WithPropagators(prop))
	return te
}

// waitSpans waits for n ended spans in r.
func waitSpans(t *testing.T, r *tracetest.SpanRecorder, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if s := r.Ended(); len(s) >= n {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spans ended, want %d", len(r.Ended()), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func attrsOf(kvs []attribute.KeyValue) map[attribute.Key]string {
	m := make(map[attribute.Key]string, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// TestTelemetry checks the client and server spans of calls ending in each way, their
// attributes and parentage, and the duration histograms.
func TestTelemetry(t *testing.T) {
	te := startTelemetry(t)
	_, port, _ := net.SplitHostPort(te.addr)
	big := bytes.Repeat([]byte{3}, 1<<20)
	cases := []struct {
		name        string
		method      string // rpc.method on the client
		serverName  string // the server span's name
		call        func(ctx context.Context) error
		code        string
		clientError bool // the client span's status is Error
		serverError bool // the server span's status is Error
		serverSpan  bool // the server saw the call and ended a span
		reqWindow   bool
	}{
		{"ok", "test.Svc/Echo", "test.Svc/Echo", func(ctx context.Context) error {
			_, err := te.svc.Echo(ctx, &Msg{Text: "hi"})
			return err
		}, "OK", false, false, true, false},
		{"large", "test.Svc/Bytes", "test.Svc/Bytes", func(ctx context.Context) error {
			out, err := te.svc.Bytes(ctx, big)
			if err == nil && !bytes.Equal(out, big) {
				err = errors.New("wrong bytes back")
			}
			return err
		}, "OK", false, false, true, true},
		{"application error", "test.Svc/Fail", "test.Svc/Fail", func(ctx context.Context) error {
			_, err := te.svc.Fail(ctx, &Msg{N: int64(rpc.NotFound)})
			return err
		}, "NOT_FOUND", true, false, true, false},
		{"deadline", "test.Svc/Sleep", "test.Svc/Sleep", func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := te.svc.Sleep(ctx, &Msg{N: int64(10 * time.Second)})
			return err
		}, "DEADLINE_EXCEEDED", true, true, true, false},
		{"unimplemented", "test.Svc/Nope", "_OTHER", func(ctx context.Context) error {
			return te.client.Invoke(ctx, "/test.Svc/Nope", &Msg{}, &Msg{})
		}, "UNIMPLEMENTED", true, true, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			te.clientSpans.Reset()
			te.serverSpans.Reset()
			bag, _ := baggage.Parse("tenant=acme")
			ctx := baggage.ContextWithBaggage(context.Background(), bag)
			err := tc.call(ctx)
			if got := statusCodeName(err); got != tc.code {
				t.Fatalf("call: %v (%s), want %s", err, got, tc.code)
			}
			cs := waitSpans(t, te.clientSpans, 1)[0]
			if cs.Name() != tc.method || cs.SpanKind() != trace.SpanKindClient {
				t.Errorf("client span %q kind %v, want %q client", cs.Name(), cs.SpanKind(), tc.method)
			}
			ca := attrsOf(cs.Attributes())
			want := map[attribute.Key]string{"rpc.system.name": "mwrpc", "rpc.method": tc.method,
				"rpc.response.status_code": tc.code, "server.address": "127.0.0.1", "server.port": port}
			if tc.code != "OK" {
				want["error.type"] = tc.code
			}
			if tc.code == "OK" {
				want["mwrpc.request.transfer"] = map[bool]string{false: "eager", true: "window"}[tc.reqWindow]
				want["mwrpc.response.transfer"] = want["mwrpc.request.transfer"]
			}
			for k, v := range want {
				if ca[k] != v {
					t.Errorf("client span %s = %q, want %q (all: %v)", k, ca[k], v, ca)
				}
			}
			if _, ok := ca["error.type"]; ok && tc.code == "OK" {
				t.Errorf("error.type on a call that succeeded: %v", ca)
			}
			if wantSt := map[bool]codes.Code{false: codes.Unset, true: codes.Error}[tc.clientError]; cs.Status().Code != wantSt {
				t.Errorf("client span status %v, want %v", cs.Status(), wantSt)
			}
			if !tc.serverSpan {
				return
			}
			ss := waitSpans(t, te.serverSpans, 1)[0]
			if ss.Name() != tc.serverName || ss.SpanKind() != trace.SpanKindServer {
				t.Errorf("server span %q kind %v, want %q server", ss.Name(), ss.SpanKind(), tc.serverName)
			}
			if ss.Parent().SpanID() != cs.SpanContext().SpanID() || ss.SpanContext().TraceID() != cs.SpanContext().TraceID() || !ss.Parent().IsRemote() {
				t.Errorf("server span's parent %v (trace %v), want the client span %v", ss.Parent(), ss.SpanContext().TraceID(), cs.SpanContext())
			}
			sa := attrsOf(ss.Attributes())
			if sa["rpc.system.name"] != "mwrpc" || sa["rpc.method"] != tc.serverName || sa["rpc.response.status_code"] != tc.code {
				t.Errorf("server span attributes %v", sa)
			}
			if tc.serverName == "_OTHER" && sa["rpc.method_original"] != tc.method {
				t.Errorf("rpc.method_original = %q, want %q", sa["rpc.method_original"], tc.method)
			}
			if wantSt := map[bool]codes.Code{false: codes.Unset, true: codes.Error}[tc.serverError]; ss.Status().Code != wantSt {
				t.Errorf("server span status %v, want %v", ss.Status(), wantSt)
			}
			if tc.serverName != "_OTHER" && tc.method != "test.Svc/Bytes" { // Bytes runs no interceptor
				te.mu.Lock()
				seen, bag := te.seen, te.baggage
				te.mu.Unlock()
				if seen.SpanID() != ss.SpanContext().SpanID() {
					t.Errorf("the handler's context has span %v, want the server span %v", seen.SpanID(), ss.SpanContext().SpanID())
				}
				if bag != "acme" {
					t.Errorf("the handler saw baggage tenant=%q, want acme", bag)
				}
			}
		})
	}

	// The duration histograms, with one point per method and status.
	for _, side := range []struct {
		reader *sdkmetric.ManualReader
		name   string
	}{{te.clientMetrics, "rpc.client.call.duration"}, {te.serverMetrics, "rpc.server.call.duration"}} {
		rm := collect(t, side.reader)
		h, ok := findMetric(rm, side.name).(metricdata.Histogram[float64])
		if !ok {
			t.Fatalf("%s: no float64 histogram in %v", side.name, metricNames(rm))
		}
		got := map[string]uint64{}
		for _, dp := range h.DataPoints {
			m, _ := dp.Attributes.Value("rpc.method")
			c, _ := dp.Attributes.Value("rpc.response.status_code")
			sys, _ := dp.Attributes.Value("rpc.system.name")
			if sys.AsString() != "mwrpc" {
				t.Errorf("%s point without rpc.system.name: %v", side.name, dp.Attributes)
			}
			got[m.AsString()+" "+c.AsString()] += dp.Count
		}
		for _, tc := range cases {
			m := tc.method
			if side.name == "rpc.server.call.duration" {
				m = tc.serverName
			}
			if got[m+" "+tc.code] == 0 {
				t.Errorf("%s: no point for %s %s in %v", side.name, m, tc.code, got)
			}
		}
	}

	// The transport's instruments: the 1 MiB request went through the client's window,
	// which the server read, then wrote the 1 MiB response into and revoked (the soft TCP
	// fabric's written responses).
	for _, side := range []struct {
		r     *sdkmetric.ManualReader
		names []string
	}{
		{te.clientMetrics, []string{"mwrpc.windows.bound", "mwrpc.windows.revoked", "mwrpc.eager.bytes"}},
		{te.serverMetrics, []string{"mwrpc.read.bytes", "mwrpc.eager.bytes"}},
	} {
		r := side.r
		rm := collect(t, r)
		for _, name := range side.names {
			if v := sumValue(findMetric(rm, name)); v <= 0 {
				t.Errorf("%s = %d, want > 0 (metrics: %v)", name, v, metricNames(rm))
			}
		}
		if v := sumValue(findMetric(rm, "mwrpc.connections.open")); v != 1 {
			t.Errorf("mwrpc.connections.open = %d, want 1", v)
		}
		if v := sumValue(findMetric(rm, "mwrpc.pool.capacity")); v <= 0 {
			t.Errorf("mwrpc.pool.capacity = %d, want > 0", v)
		}
		// One point per event kind, all zero: nobody misbehaved.
		if ev, ok := findMetric(rm, "mwrpc.peer.events").(metricdata.Sum[int64]); !ok || len(ev.DataPoints) != 9 || sumValue(ev) != 0 {
			t.Errorf("mwrpc.peer.events = %+v, want 9 points of 0", findMetric(rm, "mwrpc.peer.events"))
		}
	}
}

// TestTelemetryDroppedConnection: a call in flight when the server goes away ends its
// client span with UNAVAILABLE.
func TestTelemetryDroppedConnection(t *testing.T) {
	te := startTelemetry(t)
	errc := make(chan error, 1)
	go func() {
		_, err := te.svc.Sleep(context.Background(), &Msg{N: int64(10 * time.Second)})
		errc <- err
	}()
	waitSpans(t, te.serverSpans, 0)
	for deadline := time.Now().Add(5 * time.Second); te.srv.Stats().Served == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call never reached the server")
		}
	}
	te.srv.Stop()
	if err := <-errc; !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	cs := waitSpans(t, te.clientSpans, 1)[0]
	a := attrsOf(cs.Attributes())
	if a["rpc.response.status_code"] != "UNAVAILABLE" || a["error.type"] != "UNAVAILABLE" || cs.Status().Code != codes.Error {
		t.Errorf("client span %v, status %v", a, cs.Status())
	}
}

// TestTelemetryOff: WithoutTelemetry records nothing, and without an SDK the global
// providers' calls still carry no trace metadata.
func TestTelemetryOff(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())
	e := start(t, []rpc.ServerOption{rpc.WithTracerProvider(tp), rpc.WithoutTelemetry()},
		rpc.WithTracerProvider(tp), rpc.WithoutTelemetry())
	if _, err := e.svc.Echo(context.Background(), &Msg{Text: "x"}); err != nil {
		t.Fatal(err)
	}
	if n := len(sr.Ended()); n != 0 {
		t.Fatalf("%d spans with telemetry off", n)
	}
}

func statusCodeName(err error) string {
	names := map[rpc.Code]string{rpc.OK: "OK", rpc.NotFound: "NOT_FOUND", rpc.DeadlineExceeded: "DEADLINE_EXCEEDED",
		rpc.Unimplemented: "UNIMPLEMENTED", rpc.Unavailable: "UNAVAILABLE"}
	if err == nil {
		return "OK"
	}
	if n, ok := names[rpc.CodeOf(err)]; ok {
		return n
	}
	return rpc.CodeOf(err).String()
}

func collect(t *testing.T, r *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) metricdata.Aggregation {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m.Data
			}
		}
	}
	return nil
}

func metricNames(rm metricdata.ResourceMetrics) []string {
	var names []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names = append(names, m.Name)
		}
	}
	return names
}

func sumValue(a metricdata.Aggregation) int64 {
	s, ok := a.(metricdata.Sum[int64])
	if !ok {
		return -1
	}
	var v int64
	for _, dp := range s.DataPoints {
		v += dp.Value
	}
	return v
}
