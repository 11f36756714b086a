package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mwrpc/mwrpc/benchmarks/internal/bench"
)

// writeRuns writes one report a run under dir/NAME-i/latest.json: run i of the build has
// the cells of cells with p50 and calls/s from f(i, system).
func writeRuns(t *testing.T, dir, name, source string, runs int, f func(i int, system string) (p50 int64, ops float64)) {
	t.Helper()
	for i := 1; i <= runs; i++ {
		rep := bench.Report{Setup: bench.Setup{Source: source}}
		for _, sys := range []string{"mwrpc-tcp", "rawtcp"} {
			p50, ops := f(i, sys)
			rep.Results = append(rep.Results, bench.Result{System: sys, PayloadBytes: 1 << 20, Concurrency: 1, P50Ns: p50, OpsPerSec: ops, AllocsPerOp: 1})
		}
		rep.StreamResults = []bench.StreamResult{{System: "mwrpc-shm", Direction: "server-stream", MBPerSec: float64(1000 * i)}}
		d := filepath.Join(dir, fmt.Sprintf("%s-%d", name, i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "latest.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	// mwrpc-tcp: base p50 100, 200, 300 µs; new 50, 60, 400 µs. Calls/s: new ahead in
	// pairs 1 and 2, behind in 3. rawtcp: the same in both.
	writeRuns(t, dir, "base", "commit aaa", 3, func(i int, sys string) (int64, float64) {
		if sys == "rawtcp" {
			return 40e3, 100
		}
		return int64(i) * 100e3, 1000
	})
	writeRuns(t, dir, "new", "commit bbb", 3, func(i int, sys string) (int64, float64) {
		if sys == "rawtcp" {
			return 40e3, 100
		}
		return []int64{50e3, 60e3, 400e3}[i-1], []float64{1500, 1200, 900}[i-1]
	})
	wantLines(t, runAB(t, dir, ""), []string{
		"3 runs of the base build, 3 of the new",
		"- Base: commit aaa\n- New: commit bbb",
		// medians: p50 200 µs against 60 µs (0.30x); calls/s 1000 against 1200 (1.20x); 2 of 3 pairs
		"| 1 MiB c1 | mwrpc-tcp | 200 µs | 60.0 µs | 0.30x | 1000 | 1200 | 1.20x | 2 of 3 | 1.0 → 1.0 |",
		"| 1 MiB c1 | rawtcp | 40.0 µs | 40.0 µs | 1.00x | 100 | 100 | 1.00x | 0 of 3 |",
		"| mwrpc-shm | server-stream | 2000 | 2000 | 1.00x | 3 / 3 |",
	})
}

// runAB runs the command over the base-* and new-* runs under dir, with control, and
// returns what it printed.
func runAB(t *testing.T, dir, control string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(&out, filepath.Join(dir, "base-*", "latest.json"), filepath.Join(dir, "new-*", "latest.json"), control); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// wantLines fails t for each of wants that got lacks.
func wantLines(t *testing.T, got string, wants []string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// TestRunControl: with a control system, the steady column takes only the pairs in which
// the control's calls/s moved by at most 10%.
func TestRunControl(t *testing.T) {
	dir := t.TempDir()
	// rawtcp, the control: 100 calls/s in every run but the new build's second (60: that
	// run was slow) and third (108: within 10%). mwrpc-tcp: 1000 in every base run; new
	// 1500, 500 (the slow run), 1100.
	writeRuns(t, dir, "base", "commit aaa", 3, func(i int, sys string) (int64, float64) {
		if sys == "rawtcp" {
			return 40e3, 100
		}
		return 100e3, 1000
	})
	writeRuns(t, dir, "new", "commit bbb", 3, func(i int, sys string) (int64, float64) {
		if sys == "rawtcp" {
			return 40e3, []float64{100, 60, 108}[i-1]
		}
		return 100e3, []float64{1500, 500, 1100}[i-1]
	})
	wantLines(t, runAB(t, dir, "rawtcp"), []string{
		"Steady pairs: those in which rawtcp",
		// all pairs: median 1100 against 1000, 2 of 3 ahead; steady pairs 1 and 3: 1.50x and
		// 1.10x, median 1.30x; over the control in each run: 10 in every base run, 15, 8.33
		// and 10.19 in the new runs, median 10.19
		"| 1 MiB c1 | mwrpc-tcp | 100 µs | 100 µs | 1.00x | 1000 | 1100 | 1.10x | 2 of 3 | 1.30x (2 of 3) | 10.000 → 10.185 (1.02x) |",
		"| 1 MiB c1 | rawtcp | 40.0 µs | 40.0 µs | 1.00x | 100 | 100 | 1.00x | 1 of 3 | 1.04x (2 of 3) | - |",
	})
}

// TestRunRelToControl: runs that swing as a whole (both systems at 0.5x to 1.3x of their
// usual calls/s) hide a 10% gain from the raw medians' pairs, and the "÷ control" column,
// which divides each run by its control, shows it: 0.9 in every base run, 0.99 in every new
// one.
func TestRunRelToControl(t *testing.T) {
	dir := t.TempDir()
	swing := func(scales []float64, ratio float64) func(int, string) (int64, float64) {
		return func(i int, sys string) (int64, float64) {
			if sys == "rawtcp" {
				return 40e3, 100 * scales[i-1]
			}
			return 100e3, 100 * ratio * scales[i-1]
		}
	}
	writeRuns(t, dir, "base", "commit aaa", 3, swing([]float64{1, 0.5, 1.3}, 0.9))
	writeRuns(t, dir, "new", "commit bbb", 3, swing([]float64{0.6, 1.2, 1}, 0.99))
	wantLines(t, runAB(t, dir, "rawtcp"), []string{
		`"÷ control": the system's calls/s over rawtcp's in the same run and cell`,
		// raw: 90, 45, 117 against 59.4, 118.8, 99: medians 90 and 99, only pair 2 ahead
		"| 1 MiB c1 | mwrpc-tcp | 100 µs | 100 µs | 1.00x | 90 | 99 | 1.10x | 1 of 3 | - (0 of 3) | 0.900 → 0.990 (1.10x) |",
	})
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad", "latest.json")
	if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeRuns(t, dir, "base", "commit aaa", 1, func(int, string) (int64, float64) { return 1e3, 1 })
	other := filepath.Join(dir, "other-1", "latest.json")
	if err := os.MkdirAll(filepath.Dir(other), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte(`{"results":[{"system":"drpc","payload_bytes":64,"concurrency":1,"p50_ns":1,"ops_per_sec":1}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	baseGlob := filepath.Join(dir, "base-*", "latest.json")
	for _, c := range []struct {
		name, base, next, control, want string
	}{
		{"no flags", "", "", "", "both -base and -new"},
		{"nothing matches", baseGlob, filepath.Join(dir, "none-*", "latest.json"), "", "no report matches"},
		{"not a report", baseGlob, bad, "", "not a harness report"},
		{"no common cell", baseGlob, other, "", "no cell or streaming system is in both"},
		{"a control not measured", baseGlob, baseGlob, "shmipc", "-control shmipc: no cell of that system"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := run(&bytes.Buffer{}, c.base, c.next, c.control)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("run: %v, want an error saying %q", err, c.want)
			}
		})
	}
}
