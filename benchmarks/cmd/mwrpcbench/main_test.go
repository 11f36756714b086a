package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/bench"
	"github.com/mwrpc/mwrpc/benchmarks/internal/load"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

// asMainEnv, set to 1, makes the test binary the command: the harness's server processes
// are os.Executable(), which in a test is this binary.
const asMainEnv = "MWRPCBENCH_TEST_AS_MAIN"

// tokenEnv marks the processes one test starts, so that it can look for those left behind.
const tokenEnv = "MWRPCBENCH_TEST_TOKEN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, false))
	}
	// Every process the tests start from here on is the command.
	if err := os.Setenv(asMainEnv, "1"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(leakcheck.MainIgnoring(m, bench.PeerWorkers...))
}

// markProcesses gives the processes the test starts a token of their own and returns it.
func markProcesses(t *testing.T) string {
	tok := fmt.Sprintf("%s-%d-%d", t.Name(), os.Getpid(), time.Now().UnixNano())
	t.Setenv(tokenEnv, tok)
	return tok
}

// marked returns the live processes (not zombies) whose environment holds tok, other than
// this one, with their command lines. Linux only (it reads /proc).
func marked(t *testing.T, tok string) map[int]string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatalf("/proc: %v", err)
	}
	want := []byte(tokenEnv + "=" + tok + "\x00")
	found := map[int]string{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append(env, 0), want) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue
			}
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		found[pid] = string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
	}
	return found
}

// waitNoneMarked waits up to d for every process marked with tok to be gone.
func waitNoneMarked(t *testing.T, tok string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := marked(t, tok)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for pid, cmd := range left {
				t.Errorf("process %d left behind: %s", pid, cmd)
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
				}
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTinyMatrix runs the harness end to end in its default mode, two processes, on the
// smallest matrix (three systems, 64 B, one caller, one round of 200ms), checks what it
// writes, and that no server process is left behind.
func TestTinyMatrix(t *testing.T) {
	tok := markProcesses(t)
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-cells", "echo", "-systems", "mwrpc-tcp,mwrpc-tls,grpc,drpc,kitex,mwrpc-inproc", "-payloads", "64", "-concurrency", "1",
		"-duration", "200ms", "-warmup", "50ms", "-rounds", "1", "-out", dir}
	if code := run(args, &stdout, &stderr, false); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, stderr.String())
	}
	if runtime.GOOS == "linux" {
		waitNoneMarked(t, tok, 0)
	}
	if !strings.Contains(stderr.String(), "skipping mwrpc-inproc: in-process only") {
		t.Errorf("stderr does not say mwrpc-inproc is skipped:\n%s", stderr.String())
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
	if rep.Setup["mode"] != "two-process" || !strings.Contains(fmt.Sprint(rep.Setup["sides"]), "client's side only") {
		t.Errorf("setup mode %v, sides %v; want two-process, client's side only", rep.Setup["mode"], rep.Setup["sides"])
	}
	if fmt.Sprint(rep.Setup["left_out"]) != "[mwrpc-inproc]" {
		t.Errorf("setup left_out %v, want [mwrpc-inproc]", rep.Setup["left_out"])
	}
	for _, k := range []string{"gomaxprocs", "cpu_model", "go_version", "date"} {
		if _, ok := rep.Machine[k]; !ok {
			t.Errorf("machine has no %q", k)
		}
	}
	if len(rep.Results) != 5 {
		t.Fatalf("%d results, want 5 (one per system but mwrpc-inproc)", len(rep.Results))
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
		case "mwrpc-tcp", "mwrpc-tls": // the client's device counts: at least the payload each way
			if v, _ := copied.(float64); v < 2*64 {
				t.Errorf("%v: copied_bytes_per_op = %v, want at least 128", r["system"], copied)
			}
		case "grpc", "drpc", "kitex":
			if !present || copied != nil {
				t.Errorf("grpc: copied_bytes_per_op = %v (present %v), want null", copied, present)
			}
		default:
			t.Errorf("unexpected system %v", r["system"])
		}
		if _, ok := r["server_cpu_ns_per_op"].(float64); !ok && runtime.GOOS == "linux" {
			t.Errorf("%v: server_cpu_ns_per_op = %v, want a number (the server process's)", r["system"], r["server_cpu_ns_per_op"])
		}
		if p50, p99 := r["p50_ns"].(float64), r["p99_ns"].(float64); p50 > p99 {
			t.Errorf("%v: p50 %v above p99 %v", r["system"], p50, p99)
		}
	}

	md, err := os.ReadFile(filepath.Join(dir, "latest.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| mwrpc-tcp | 64 B | 1 |", "| mwrpc-tls | 64 B | 1 |", "| grpc | 64 B | 1 |", "| drpc | 64 B | 1 |", "| kitex | 64 B | 1 |", "Mode: **two-process**", "client's side only",
		"in-process only): mwrpc-inproc", "latency_p50.png"} {
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
	if !strings.Contains(stderr.String(), "[1/5]") || !strings.Contains(stderr.String(), "[5/5]") {
		t.Errorf("no progress lines on stderr:\n%s", stderr.String())
	}
}

// TestInProcessMode runs the same tiny matrix with -mode inproc, mwrpc-inproc included.
func TestInProcessMode(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-mode", "inproc", "-cells", "echo", "-systems", "mwrpc-inproc,rawtcp", "-payloads", "64", "-concurrency", "1",
		"-duration", "100ms", "-warmup", "20ms", "-rounds", "1", "-out", dir}
	if code := run(args, &stdout, &stderr, false); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, stderr.String())
	}
	for _, want := range []string{"(inproc)", "| mwrpc-inproc | 64 B | 1 |", "| rawtcp | 64 B | 1 |", "same process"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("latest.md lacks %q", want)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"mode": "inproc"`)) {
		t.Error(`latest.json lacks "mode": "inproc"`)
	}
	if bytes.Contains(b, []byte(`"server_cpu_ns_per_op": 0`)) || !bytes.Contains(b, []byte(`"server_cpu_ns_per_op": null`)) {
		t.Error("inproc: server_cpu_ns_per_op is not null")
	}
}

// TestHarnessKilled kills a harness (SIGKILL: no cleanup of its own) while its server
// process runs, and checks that the server process goes too.
func TestHarnessKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("looks for processes in /proc")
	}
	tok := markProcesses(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := exec.Command(exe, "-systems", "rawtcp", "-payloads", "64", "-concurrency", "1",
		"-duration", "20s", "-warmup", "0s", "-rounds", "1", "-out", t.TempDir())
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Process.Kill(); _ = h.Wait() }()

	deadline := time.Now().Add(10 * time.Second)
	var server int
	for server == 0 {
		for pid, cmd := range marked(t, tok) {
			if strings.Contains(cmd, "-serve-system rawtcp") {
				server = pid
			}
		}
		if server == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no server process started within 10s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := h.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.Wait()
	waitNoneMarked(t, tok, 5*time.Second)
}

// TestStreamCell runs the streaming cell end to end in two-process mode, tiny (8 MiB each
// way in 1 MiB messages, one round, a warm-up), for every system that streams, checks what
// it writes, and that no server process is left behind.
func TestStreamCell(t *testing.T) {
	tok := markProcesses(t)
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"-cells", "stream", "-stream-size", "8MiB", "-stream-chunk", "1MiB", "-rounds", "1", "-out", dir,
		"-server-cpuprofile", filepath.Join(dir, "srv")}
	done := make(chan int, 1)
	go func() { done <- run(args, &stdout, &stderr, false) }()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit status %d:\n%s", code, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the streaming cell took more than 2 minutes for 8 MiB")
	}
	if runtime.GOOS == "linux" {
		waitNoneMarked(t, tok, 0)
	}
	want := map[string]bool{}
	for _, s := range bench.Systems {
		if s.Streams() {
			want[s.Name] = true
		}
	}
	for _, s := range []string{"rawtcp", "grpc"} {
		if !want[s] {
			t.Errorf("system %s is not in the streaming cell", s)
		}
	}

	b, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Setup struct {
			Mode          string           `json:"mode"`
			Cells         []string         `json:"cells"`
			StreamBytes   int64            `json:"stream_bytes"`
			StreamChunk   int              `json:"stream_chunk_bytes"`
			StreamSystems []map[string]any `json:"stream_systems"`
		} `json:"setup"`
		Results       []map[string]any `json:"results"`
		StreamResults []map[string]any `json:"stream_results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if s := rep.Setup; s.Mode != "two-process" || fmt.Sprint(s.Cells) != "[stream]" || s.StreamBytes != 8<<20 || s.StreamChunk != 1<<20 || len(s.StreamSystems) != len(want) {
		t.Errorf("setup: mode %s, cells %v, %d bytes in %d, %d systems; want two-process, [stream], 8 MiB in 1 MiB, %d systems",
			s.Mode, s.Cells, s.StreamBytes, s.StreamChunk, len(s.StreamSystems), len(want))
	}
	if len(rep.Results) != 0 {
		t.Errorf("%d echo results, want none with -cells stream", len(rep.Results))
	}
	if len(rep.StreamResults) != 2*len(want) {
		t.Fatalf("%d stream results, want %d (two per system)", len(rep.StreamResults), 2*len(want))
	}
	seen := map[string]bool{}
	for _, r := range rep.StreamResults {
		name := fmt.Sprintf("%v %v", r["system"], r["direction"])
		seen[name] = true
		if !want[fmt.Sprint(r["system"])] || (r["direction"] != "server-stream" && r["direction"] != "client-stream") {
			t.Errorf("unexpected result %s", name)
		}
		if v, _ := r["mb_per_sec"].(float64); v <= 0 {
			t.Errorf("%s: mb_per_sec = %v, want > 0", name, r["mb_per_sec"])
		}
		if v, ok := r["client_cpu_s_per_gib"].(float64); !ok || v < 0 {
			t.Errorf("%s: client_cpu_s_per_gib = %v, want a number", name, r["client_cpu_s_per_gib"])
		}
		if v, ok := r["server_cpu_s_per_gib"].(float64); (!ok || v < 0) && runtime.GOOS == "linux" {
			t.Errorf("%s: server_cpu_s_per_gib = %v, want a number (the server process's)", name, r["server_cpu_s_per_gib"])
		}
		if r["total_bytes"] != float64(8<<20) || r["chunk_bytes"] != float64(1<<20) || r["rounds"] != 1.0 {
			t.Errorf("%s: %v bytes in %v, %v rounds; want 8 MiB in 1 MiB, 1 round", name, r["total_bytes"], r["chunk_bytes"], r["rounds"])
		}
	}
	if len(seen) != len(rep.StreamResults) {
		t.Errorf("duplicate results: %v", seen)
	}

	md, err := os.ReadFile(filepath.Join(dir, "latest.md"))
	if err != nil {
		t.Fatal(err)
	}
	wantMD := []string{"## Streaming (two-process)", "8 MiB in 1 MiB messages", "stream_mbps.png"}
	for s := range want {
		wantMD = append(wantMD, "| "+s+" | ")
	}
	for _, w := range wantMD {
		if !strings.Contains(string(md), w) {
			t.Errorf("latest.md lacks %q", w)
		}
	}
	if strings.Contains(string(md), "## Results") {
		t.Error("latest.md has an echo table with -cells stream")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "stream_mbps.png")); err != nil {
		t.Error(err)
	} else if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Error("stream_mbps.png is not a PNG")
	}
	for s := range want {
		if fi, err := os.Stat(filepath.Join(dir, "srv."+s+".stream.pprof")); err != nil || fi.Size() == 0 {
			t.Errorf("%s: no server CPU profile (%v)", s, err)
		}
	}
	if n := strings.Count(stderr.String(), "] stream 8 MiB"); n != 2*len(want) {
		t.Errorf("%d progress lines for transfers on stderr, want %d:\n%s", n, 2*len(want), stderr.String())
	}
}

func TestServeUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-serve-system", "corba", "-listen", "127.0.0.1:0"}, &stdout, &stderr, false); code != 1 {
		t.Errorf("-serve-system corba: exit status %d, want 1 (stderr %q)", code, stderr.String())
	}
	if code := run([]string{"-serve-system", "mwrpc-inproc"}, &stdout, &stderr, false); code != 1 {
		t.Errorf("-serve-system mwrpc-inproc: exit status %d, want 1 (stderr %q)", code, stderr.String())
	}
	if code := run([]string{"-serve-system", "drpc", "-serve-cell", "stream"}, &stdout, &stderr, false); code != 1 {
		t.Errorf("-serve-system drpc -serve-cell stream: exit status %d, want 1 (stderr %q)", code, stderr.String())
	}
	if code := run([]string{"-serve-system", "rawtcp", "-serve-cell", "bulk"}, &stdout, &stderr, false); code != 2 {
		t.Errorf("-serve-cell bulk: exit status %d, want 2 (stderr %q)", code, stderr.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-systems", "corba"},
		{"-mode", "threads"},
		{"-systems", "mwrpc-inproc"}, // in-process only, and the mode is two-process
		{"-cells", "echo", "-systems", "mwrpc-inproc"},
		{"-payloads", "12XB"},
		{"-concurrency", "0"},
		{"-rounds", "0"},
		{"-payloads", "16MiB", "-concurrency", "64", "-max-inflight", "1MiB"},
		{"extra"},
		{"-cells", "ping"},
		{"-cells", ","},
		{"-cells", "stream", "-systems", "drpc"}, // drpc does not stream
		{"-cells", "stream", "-stream-size", "0"},
		{"-cells", "stream", "-stream-size", "2TiB"},
		{"-cells", "stream", "-stream-chunk", "128MiB"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append(args, "-out", t.TempDir()), &stdout, &stderr, false); code != 2 {
			t.Errorf("%q: exit status %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"64": 64, "64B": 64, "4KiB": 4096, "4k": 4096, "1MiB": 1 << 20, "16M": 16 << 20, " 2 mib ": 2 << 20} {
		if got, err := load.ParseSize(in); err != nil || got != want {
			t.Errorf("load.ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1GiB", "4096MiB"} {
		if _, err := load.ParseSize(in); err == nil {
			t.Errorf("load.ParseSize(%q): no error", in)
		}
	}
}

// TestCPUSplit: -cpus pins the server processes and the harness to disjoint CPUs and says
// so in the report; -list-systems names what "all" runs in two processes.
func TestCPUSplit(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.NumCPU() < 2 {
		t.Skip("-cpus needs Linux and two CPUs")
	}
	var list bytes.Buffer
	if code := run([]string{"-list-systems"}, &list, io.Discard, false); code != 0 || !strings.Contains(list.String(), "kitex\n") || strings.Contains(list.String(), "mwrpc-inproc") {
		t.Fatalf("-list-systems: exit %d, %q; want kitex and not mwrpc-inproc", code, list.String())
	}
	dir := t.TempDir()
	last := runtime.NumCPU() - 1
	var stdout, stderr bytes.Buffer
	args := []string{"-cells", "echo", "-systems", "rawtcp,kitex", "-payloads", "64", "-concurrency", "1", "-cpus", fmt.Sprintf("0/%d", last),
		"-duration", "100ms", "-warmup", "20ms", "-rounds", "1", "-out", dir}
	code := run(args, &stdout, &stderr, false)
	os.Unsetenv(bench.ServeCPUsEnv)      // -cpus set it for its server processes
	runtime.GOMAXPROCS(runtime.NumCPU()) // and pinned this process: give the other tests the machine back
	if err := unpin(); err != nil {
		t.Log(err)
	}
	if code != 0 {
		t.Fatalf("exit status %d:\n%s", code, stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "latest.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("server processes pinned to CPUs 0 (GOMAXPROCS 1), the clients to CPUs %d (GOMAXPROCS 1)", last); !strings.Contains(string(b), want) {
		t.Errorf("the report does not say %q:\n%s", want, b)
	}
}

// unpin gives this process every CPU back after a -cpus run.
func unpin() error {
	all := make([]int, runtime.NumCPU())
	for i := range all {
		all[i] = i
	}
	return bench.PinCPUs(all)
}
