package bench

import (
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
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median(3,1,2) = %v", m)
	}
	if m := median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("median(4,1,2,3) = %v", m)
	}
}

func TestCellsSkipsAboveInflight(t *testing.T) {
	cfg := Config{Payloads: []int{64, 1 << 20, 16 << 20}, Concurrency: []int{1, 8, 64}, MaxInflight: 128 << 20}
	run, skipped := cfg.Cells()
	if len(run) != 8 || len(skipped) != 1 || skipped[0] != (Cell{16 << 20, 64}) {
		t.Errorf("run %v, skipped %v; want all but 16 MiB c64", run, skipped)
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
