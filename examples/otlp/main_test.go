package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	colmetric "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// receiver is an OTLP/HTTP receiver: it decodes the protobuf export requests the SDK posts
// to /v1/traces and /v1/metrics.
type receiver struct {
	mu      sync.Mutex
	spans   []*tracepb.Span
	metrics map[string]bool
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf body", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch req.URL.Path {
	case "/v1/traces":
		var m coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range m.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	case "/v1/metrics":
		var m colmetric.ExportMetricsServiceRequest
		if err := proto.Unmarshal(body, &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rm := range m.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, mm := range sm.Metrics {
					r.metrics[mm.Name] = true
				}
			}
		}
		out, _ := proto.Marshal(&colmetric.ExportMetricsServiceResponse{})
		_, _ = w.Write(out)
	default:
		http.NotFound(w, req)
	}
}

// TestOTLPExport runs the example against a receiver inside the test: the spans and
// metrics arrive over OTLP/HTTP, with the server spans children of the client spans.
func TestOTLPExport(t *testing.T) {
	rcv := &receiver{metrics: map[string]bool{}}
	hs := httptest.NewServer(rcv)
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, strings.TrimPrefix(hs.URL, "http://")); err != nil {
		t.Fatal(err)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	clients := map[string]*tracepb.Span{}
	for _, s := range rcv.spans {
		if s.Kind == tracepb.Span_SPAN_KIND_CLIENT {
			clients[hex.EncodeToString(s.SpanId)] = s
		}
	}
	servers := 0
	for _, s := range rcv.spans {
		if s.Kind != tracepb.Span_SPAN_KIND_SERVER {
			continue
		}
		servers++
		p := clients[hex.EncodeToString(s.ParentSpanId)]
		if p == nil || string(p.TraceId) != string(s.TraceId) || p.Name != s.Name {
			t.Errorf("server span %s has no client parent", s.Name)
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes {
			attrs[kv.Key] = kv.Value.GetStringValue()
		}
		if attrs["rpc.system.name"] != "mwrpc" || attrs["rpc.method"] != s.Name || attrs["rpc.response.status_code"] == "" {
			t.Errorf("server span %s attributes %v", s.Name, attrs)
		}
	}
	if servers != 3 || len(clients) != 3 {
		t.Errorf("%d server and %d client spans, want 3 each", servers, len(clients))
	}
	for _, m := range []string{"rpc.client.call.duration", "rpc.server.call.duration", "mwrpc.windows.bound", "mwrpc.windows.revoked", "mwrpc.read.bytes", "mwrpc.pool.used"} {
		if !rcv.metrics[m] {
			t.Errorf("metric %s never arrived (got %v)", m, rcv.metrics)
		}
	}
}
