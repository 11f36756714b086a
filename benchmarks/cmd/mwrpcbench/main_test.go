package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTinyMatrix runs the harness end to end on the smallest matrix (two systems, 64 B,
// one caller, one round of 200ms) and checks what it writes.
func TestTinyMatrix(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-systems", "mwrpc-tcp,grpc", "-payloads", "64", "-concurrency", "1",
		"-duration", "200ms", "-warmup", "50ms", "-rounds", "1", "-out", dir}
	if code := run(args, &stdout, &stderr, false); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, stderr.String())
	}

	b, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Machine map[string]any   `json:"machine"`
		Setup   map[string]any   `json:"setup"`
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"gomaxprocs", "cpu_model", "go_version", "date"} {
		if _, ok := rep.Machine[k]; !ok {
			t.Errorf("machine has no %q", k)
		}
	}
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2 (one per system)", len(rep.Results))
	}
	for _, r := range rep.Results {
		for _, k := range []string{"p50_ns", "p99_ns", "p999_ns", "ops_per_sec", "mb_per_sec", "cpu_ns_per_op", "allocs_per_op"} {
			if v, _ := r[k].(float64); v <= 0 {
				t.Errorf("%v: %s = %v, want > 0", r["system"], k, r[k])
			}
		}
		if r["payload_bytes"] != 64.0 || r["concurrency"] != 1.0 {
			t.Errorf("%v: cell %v/%v, want 64/1", r["system"], r["payload_bytes"], r["concurrency"])
		}
		copied, present := r["copied_bytes_per_op"]
		switch r["system"] {
		case "mwrpc-tcp": // the soft provider counts: at least the payload each way
			if v, _ := copied.(float64); v < 2*64 {
				t.Errorf("mwrpc-tcp: copied_bytes_per_op = %v, want at least 128", copied)
			}
		case "grpc":
			if !present || copied != nil {
				t.Errorf("grpc: copied_bytes_per_op = %v (present %v), want null", copied, present)
			}
		default:
			t.Errorf("unexpected system %v", r["system"])
		}
		if p50, p99 := r["p50_ns"].(float64), r["p99_ns"].(float64); p50 > p99 {
			t.Errorf("%v: p50 %v above p99 %v", r["system"], p50, p99)
		}
	}

	md, err := os.ReadFile(filepath.Join(dir, "latest.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| mwrpc-tcp | 64 B | 1 |", "| grpc | 64 B | 1 |", "same process", "latency_p50.png"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("latest.md lacks %q", want)
		}
	}
	if !bytes.Equal(md, stdout.Bytes()) {
		t.Error("stdout is not latest.md")
	}
	for _, name := range []string{"latency_p50.png", "throughput_ops.png", "throughput_mbps.png"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
		} else if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
			t.Errorf("%s is not a PNG", name)
		}
	}
	if !strings.Contains(stderr.String(), "[1/2]") || !strings.Contains(stderr.String(), "[2/2]") {
		t.Errorf("no progress lines on stderr:\n%s", stderr.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-systems", "corba"},
		{"-payloads", "12XB"},
		{"-concurrency", "0"},
		{"-rounds", "0"},
		{"-payloads", "16MiB", "-concurrency", "64", "-max-inflight", "1MiB"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append(args, "-out", t.TempDir()), &stdout, &stderr, false); code != 2 {
			t.Errorf("%q: exit status %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"64": 64, "64B": 64, "4KiB": 4096, "4k": 4096, "1MiB": 1 << 20, "16M": 16 << 20, " 2 mib ": 2 << 20} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1GiB", "4096MiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
}
