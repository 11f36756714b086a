package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the example's main instead of the tests when KV_EXAMPLE_MAIN is set, so
// that a test can start the example as separate processes (the SDK it installs is then
// global to that process alone).
func TestMain(m *testing.M) {
	if os.Getenv("KV_EXAMPLE_MAIN") == "1" {
		os.Args = append(os.Args[:1], strings.Fields(os.Getenv("KV_EXAMPLE_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(leakcheck.Main(m))
}

// example starts this test binary as the example with args.
func example(t *testing.T, ctx context.Context, args string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "KV_EXAMPLE_MAIN=1", "KV_EXAMPLE_ARGS="+args)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// requireInterrupt skips t on Windows, saying why: the test stops the example's server
// with SIGINT, as Ctrl+C would, and Windows cannot send a signal to another process
// (os.Process.Signal there sends Kill alone).
func requireInterrupt(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("stops the server process with SIGINT, which Windows cannot send to another process")
	}
}

// serveExample starts the example with -serve on a free loopback port and the further
// args, waits for the address it logs, and collects the rest of its log (stderr) in logs;
// its stdout goes to stdout. The process is killed at the test's end if still running.
func serveExample(t *testing.T, ctx context.Context, args string, stdout io.Writer) (cmd *exec.Cmd, addr string, logs *syncWriter) {
	t.Helper()
	cmd = example(t, ctx, "-serve 127.0.0.1:0 "+args)
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	logs = new(syncWriter)
	sc := bufio.NewScanner(stderr)
	for addr == "" && sc.Scan() {
		logs.WriteLine(sc.Text())
		if m := regexp.MustCompile(`serving kvservice.KV on (\S+)`).FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("the server never said where it serves:\n%s", logs.String())
	}
	go func() {
		for sc.Scan() {
			logs.WriteLine(sc.Text())
		}
	}()
	return cmd, addr, logs
}

// syncWriter collects lines from one goroutine for another.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// WriteLine appends s and a newline.
func (w *syncWriter) WriteLine(s string) { w.mu.Lock(); defer w.mu.Unlock(); w.b.WriteString(s + "\n") }

func (w *syncWriter) String() string { w.mu.Lock(); defer w.mu.Unlock(); return w.b.String() }

// span is what the stdout exporter prints of a span (the fields the test reads).
type span struct {
	Name        string
	SpanKind    int
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct {
		TraceID, SpanID string
		Remote          bool
	}
	Attributes []struct {
		Key   string
		Value struct{ Value any }
	}
}

func (s span) attr(k string) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			b, _ := json.Marshal(a.Value.Value)
			return strings.Trim(string(b), `"`)
		}
	}
	return ""
}

// parseOutput splits the example's output into spans and metric names: the exporters
// pretty-print one JSON object per span or collection, from a "{" line to a "}" line.
func parseOutput(t *testing.T, out []byte) (spans []span, metrics map[string]bool) {
	t.Helper()
	metrics = map[string]bool{}
	var chunk []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "{" || len(chunk) > 0 {
			chunk = append(chunk, line)
		}
		if line != "}" || len(chunk) == 0 {
			continue
		}
		obj := []byte(strings.Join(chunk, "\n"))
		chunk = nil
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(obj, &probe); err != nil {
			t.Fatalf("unparsable JSON from the exporter: %v\n%s", err, obj)
		}
		if _, ok := probe["ScopeMetrics"]; ok {
			for _, m := range regexp.MustCompile(`"Name": "([a-z.]+)"`).FindAllStringSubmatch(string(obj), -1) {
				metrics[m[1]] = true
			}
			continue
		}
		var s span
		if err := json.Unmarshal(obj, &s); err != nil {
			t.Fatal(err)
		}
		spans = append(spans, s)
	}
	return spans, metrics
}

// checkTrace checks that every server span is the child of a client span of the same
// trace, and that the calls the example traces are there with their status codes.
func checkTrace(t *testing.T, client, server []span) {
	t.Helper()
	byID := map[string]span{}
	for _, s := range client {
		if s.SpanKind != 3 { // trace.SpanKindClient
			t.Errorf("client-side span %s of kind %d", s.Name, s.SpanKind)
		}
		byID[s.SpanContext.SpanID] = s
	}
	codes := map[string]int{}
	for _, s := range server {
		if s.SpanKind != 2 { // trace.SpanKindServer
			t.Errorf("server-side span %s of kind %d", s.Name, s.SpanKind)
		}
		p, ok := byID[s.Parent.SpanID]
		if !ok || !s.Parent.Remote || p.SpanContext.TraceID != s.SpanContext.TraceID || p.Name != s.Name {
			t.Errorf("server span %s (trace %s) has no client parent: %+v", s.Name, s.SpanContext.TraceID, s.Parent)
		}
		if s.attr("rpc.system.name") != "mwrpc" || s.attr("rpc.method") != s.Name {
			t.Errorf("server span %s attributes %+v", s.Name, s.Attributes)
		}
		codes[s.Name+" "+s.attr("rpc.response.status_code")]++
	}
	for _, want := range []string{"kvservice.KV/Put OK", "kvservice.KV/Get OK", "kvservice.KV/Delete OK", "kvservice.KV/Get NOT_FOUND"} {
		if codes[want] == 0 {
			t.Errorf("no server span %s in %v", want, codes)
		}
	}
	if len(client) != len(server) {
		t.Errorf("%d client spans, %d server spans", len(client), len(server))
	}
}

var wantMetrics = []string{"rpc.client.call.duration", "rpc.server.call.duration", "mwrpc.windows.bound", "mwrpc.windows.revoked", "mwrpc.read.bytes"}

// TestTelemetryStdout runs `kv -telemetry=stdout` (one process): client and server spans
// share trace IDs, and the metrics come out at exit.
func TestTelemetryStdout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := example(t, ctx, "-telemetry=stdout -calls 20").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	spans, metrics := parseOutput(t, out)
	var client, server []span
	for _, s := range spans {
		if s.SpanKind == 3 {
			client = append(client, s)
		} else {
			server = append(server, s)
		}
	}
	checkTrace(t, client, server)
	for _, m := range wantMetrics {
		if !metrics[m] {
			t.Errorf("no metric %s in the output (have %v)", m, metrics)
		}
	}
}

// TestTelemetryTwoProcesses runs `-serve` and `-connect` as two processes, both with
// -telemetry=stdout: the server's spans are children of the client's, across processes.
func TestTelemetryTwoProcesses(t *testing.T) {
	requireInterrupt(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var srvOut bytes.Buffer
	srv, addr, logs := serveExample(t, ctx, "-telemetry=stdout", &srvOut)
	cliOut, err := example(t, ctx, "-connect "+addr+" -telemetry=stdout -calls 20").CombinedOutput()
	if err != nil {
		t.Fatalf("client: %v\n%s", err, cliOut)
	}
	if err := srv.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v\n%s%s", err, srvOut.String(), logs.String())
	}
	client, cm := parseOutput(t, cliOut)
	server, sm := parseOutput(t, srvOut.Bytes())
	checkTrace(t, client, server)
	for _, m := range []string{"rpc.client.call.duration", "mwrpc.read.bytes"} {
		if !cm[m] {
			t.Errorf("client printed no %s (have %v)", m, cm)
		}
	}
	for _, m := range []string{"rpc.server.call.duration", "mwrpc.windows.bound", "mwrpc.windows.revoked"} {
		if !sm[m] {
			t.Errorf("server printed no %s (have %v)", m, sm)
		}
	}
}
