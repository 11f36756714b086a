package bench

import (
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i))
	}
	for q, want := range map[int]time.Duration{500: 500, 990: 990, 999: 999, 1000: 1000, 1: 1} {
		if got := quantile(s, q); got != want {
			t.Errorf("quantile(1..1000, %d) = %d, want %d", q, got, want)
		}
	}
	if got := quantile(s[:1], 999); got != 1 {
		t.Errorf("quantile of one sample = %d", got)
	}
	if got := quantile(s[:10], 990); got != 10 { // nearest rank: ceil(9.9) = 10
		t.Errorf("p99 of 10 samples = %d, want 10", got)
	}
}

func TestMedian(t *testing.T) {
	if m := Median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("Median(3,1,2) = %v", m)
	}
	if m := Median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("Median(4,1,2,3) = %v", m)
	}
}

func TestCellsSkipsAboveInflight(t *testing.T) {
	// The full matrix at the default cap (128 MiB): only 16 MiB c16 and c64 are skipped;
	// 64 KiB c64 and 1 MiB c16 and c64 run.
	cfg := Config{Payloads: []int{64, 4 << 10, 64 << 10, 1 << 20, 16 << 20}, Concurrency: []int{1, 16, 64}, MaxInflight: 128 << 20}
	run, skipped := cfg.Cells()
	if len(run) != 13 || !slices.Equal(skipped, []Cell{{16 << 20, 16}, {16 << 20, 64}}) {
		t.Errorf("run %v, skipped %v; want all but 16 MiB c16 and c64", run, skipped)
	}
	for _, c := range []Cell{{64 << 10, 64}, {1 << 20, 16}, {1 << 20, 64}, {16 << 20, 1}} {
		if !slices.Contains(run, c) {
			t.Errorf("%v does not run", c)
		}
	}
}

func TestRunSystems(t *testing.T) {
	echo := 0
	for _, s := range Systems {
		if s.Echo() {
			echo++
		}
	}
	cfg := Config{Systems: Systems}
	run, left := cfg.RunSystems()
	if len(run) != echo-1 || !slices.Equal(left, []string{"mwrpc-inproc"}) {
		t.Errorf("two-process: run %d systems, left out %v; want all of the echo matrix but mwrpc-inproc", len(run), left)
	}
	cfg.Mode = ModeInProcess
	if run, left := cfg.RunSystems(); len(run) != echo || len(left) != 0 {
		t.Errorf("inproc: run %d systems, left out %v; want all of the echo matrix", len(run), left)
	}
}

// TestServerProcessWithoutAddress: a server process that exits without printing its
// address is an error, not a hang.
func TestServerProcessWithoutAddress(t *testing.T) {
	exe, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true(1):", err)
	}
	start := time.Now()
	if p, err := startServer(exe, "rawtcp", CellEcho, ""); err == nil {
		_ = p.stop()
		t.Fatal("startServer succeeded with a program that prints nothing")
	} else if !strings.Contains(err.Error(), "no address") {
		t.Errorf("error %q does not say the address is missing", err)
	}
	if d := time.Since(start); d > serverStartTimeout/2 {
		t.Errorf("took %v: waited for the timeout instead of the exit", d)
	}
}

// TestServeMainStopsAtEOF: a server process stops when its stdin ends (the harness is
// gone), after having written its address.
func TestServeMainStopsAtEOF(t *testing.T) {
	pr, pw := io.Pipe()
	out := &headBuffer{max: 1 << 10}
	done := make(chan error, 1)
	go func() { done <- ServeMain("rawtcp", CellEcho, "127.0.0.1:0", pr, out) }()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.HasSuffix(out.String(), "\n") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	addr := strings.TrimSpace(out.String())
	inst, err := dialRawTCP(addr, 64, 1)
	if err != nil {
		t.Fatalf("dial %q: %v", addr, err)
	}
	if err := inst.Call(0); err != nil {
		t.Errorf("call: %v", err)
	}
	_ = inst.Close()
	_ = pw.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeMain: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeMain still serving 5s after the end of stdin")
	}
	if err := ServeMain("mwrpc-inproc", CellEcho, "127.0.0.1:0", pr, io.Discard); err == nil {
		t.Error("ServeMain served mwrpc-inproc, which has no server of its own")
	}
}

func TestSummarize(t *testing.T) {
	rounds := []Round{
		{Ops: 100, Elapsed: time.Second, P50: 10, P99: 20, P999: 30, Mallocs: 500, CPU: 100 * time.Microsecond},
		{Ops: 300, Elapsed: time.Second, P50: 30, P99: 40, P999: 50, Mallocs: 900, CPU: 900 * time.Microsecond},
		{Ops: 200, Elapsed: time.Second, P50: 20, P99: 30, P999: 40, Mallocs: 800, CPU: 400 * time.Microsecond},
	}
	r := summarize("x", Cell{1000, 2}, rounds)
	if r.P50Ns != 20 || r.P99Ns != 30 || r.P999Ns != 40 || r.OpsPerSec != 200 || r.Ops != 600 {
		t.Errorf("medians: %+v", r)
	}
	if r.MBPerSec != 0.4 { // 200 ops/s × 2 × 1000 B
		t.Errorf("MB/s = %v, want 0.4", r.MBPerSec)
	}
	if r.AllocsPerOp != 4 || r.CPUNsPerOp != 2000 { // per round 5, 3, 4 and 1000, 3000, 2000 ns
		t.Errorf("allocs/op %v, cpu ns/op %v; want 4 and 2000", r.AllocsPerOp, r.CPUNsPerOp)
	}
	if r.CopiedBytesPerOp != nil {
		t.Errorf("copied = %v, want nil for a system without counters", *r.CopiedBytesPerOp)
	}
}
