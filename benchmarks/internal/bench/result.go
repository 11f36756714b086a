package bench

import (
	"fmt"
	"slices"
	"time"
)

// Result is one system in one cell: medians across rounds. It is one object of the
// "results" array of latest.json.
type Result struct {
	System       string `json:"system"`
	PayloadBytes int    `json:"payload_bytes"`
	Concurrency  int    `json:"concurrency"`
	// Latency of one call as its caller sees it, nearest-rank percentiles of all the calls
	// of a round; the median of the rounds' values.
	P50Ns  int64 `json:"p50_ns"`
	P99Ns  int64 `json:"p99_ns"`
	P999Ns int64 `json:"p999_ns"`
	// OpsPerSec counts completed calls over the round's wall time.
	OpsPerSec float64 `json:"ops_per_sec"`
	// MBPerSec is payload bytes moved per second, request and response together (2 ×
	// payload per call), in units of 10^6 bytes.
	MBPerSec float64 `json:"mb_per_sec"`
	// AllocsPerOp and AllocBytesPerOp are runtime.MemStats Mallocs and TotalAlloc deltas
	// over the round divided by its calls, in the harness's process: client and server
	// together in inproc mode, the client alone in two-process mode.
	AllocsPerOp     float64 `json:"allocs_per_op"`
	AllocBytesPerOp float64 `json:"alloc_bytes_per_op"`
	// CPUNsPerOp is getrusage(RUSAGE_SELF) user+system time over the round divided by its
	// calls, on all cores: client and server together in inproc mode, the client alone in
	// two-process mode.
	CPUNsPerOp float64 `json:"cpu_ns_per_op"`
	// ServerCPUNsPerOp is the server process's user+system time over the round divided by
	// its calls (two-process mode on Linux: /proc/PID/stat, 10 ms ticks, so a coarse figure
	// for short rounds); null in inproc mode, where CPUNsPerOp holds both sides.
	ServerCPUNsPerOp *float64 `json:"server_cpu_ns_per_op"`
	// CopiedBytesPerOp is what the soft provider counts (soft.Device.Stats: SocketTxBytes +
	// SocketRxBytes + CopyBytes + PlacedBytes of the devices in this process: both in inproc mode, the
	// client's in two-process mode) per call; null for systems without such
	// counters.
	CopiedBytesPerOp *float64 `json:"copied_bytes_per_op"`
	// RunQueueMsPerS is how long the harness process's threads, together, waited on a
	// CPU run queue (runnable, not running) per second of the round, in ms (Linux
	// schedstat); ServerRunQueueMsPerS the same for the server process (two-process
	// mode). Null where unknown. Starved rows (see starved) are the machine's figures.
	RunQueueMsPerS       *float64 `json:"run_queue_ms_per_s"`
	ServerRunQueueMsPerS *float64 `json:"server_run_queue_ms_per_s"`
	// Rounds and Ops: how many rounds, and calls over all of them.
	Rounds int   `json:"rounds"`
	Ops    int64 `json:"ops"`
	// The per-round p50 and ops/s behind the medians, to show their spread.
	RoundP50Ns     []int64   `json:"round_p50_ns"`
	RoundOpsPerSec []float64 `json:"round_ops_per_sec"`
}

// Cell returns the result's cell.
func (r *Result) Cell() Cell { return Cell{r.PayloadBytes, r.Concurrency} }

func summarize(system string, cell Cell, rounds []Round) Result {
	res := Result{System: system, PayloadBytes: cell.Payload, Concurrency: cell.Concurrency, Rounds: len(rounds)}
	var p50, p99, p999, ops, allocs, allocBytes, cpu, scpu, copied, wait, swait []float64
	for _, r := range rounds {
		n := float64(r.Ops)
		res.Ops += r.Ops
		res.RoundP50Ns = append(res.RoundP50Ns, r.P50.Nanoseconds())
		res.RoundOpsPerSec = append(res.RoundOpsPerSec, round3(r.OpsPerSec()))
		p50 = append(p50, float64(r.P50))
		p99 = append(p99, float64(r.P99))
		p999 = append(p999, float64(r.P999))
		ops = append(ops, r.OpsPerSec())
		allocs = append(allocs, float64(r.Mallocs)/n)
		allocBytes = append(allocBytes, float64(r.AllocBytes)/n)
		cpu = append(cpu, float64(r.CPU)/n)
		scpu = append(scpu, float64(r.ServerCPU)/n)
		copied = append(copied, float64(r.Copied)/n)
		wait = append(wait, float64(r.Waited)/1e6/r.Elapsed.Seconds())
		swait = append(swait, float64(r.ServerWaited)/1e6/r.Elapsed.Seconds())
	}
	res.P50Ns = int64(Median(p50))
	res.P99Ns = int64(Median(p99))
	res.P999Ns = int64(Median(p999))
	res.OpsPerSec = round3(Median(ops))
	res.MBPerSec = round3(res.OpsPerSec * 2 * float64(cell.Payload) / 1e6)
	res.AllocsPerOp = round3(Median(allocs))
	res.AllocBytesPerOp = round3(Median(allocBytes))
	res.CPUNsPerOp = round3(Median(cpu))
	if len(rounds) > 0 && rounds[0].HasServerCPU {
		c := round3(Median(scpu))
		res.ServerCPUNsPerOp = &c
	}
	if len(rounds) > 0 && rounds[0].HasWaited {
		w := round3(Median(wait))
		res.RunQueueMsPerS = &w
	}
	if len(rounds) > 0 && rounds[0].HasServerWaited {
		w := round3(Median(swait))
		res.ServerRunQueueMsPerS = &w
	}
	if len(rounds) > 0 && rounds[0].HasCopied {
		c := round3(Median(copied))
		res.CopiedBytesPerOp = &c
	}
	return res
}

// Median is the median of v (the mean of the middle two for an even count), 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// round3 keeps three decimals: enough for any figure here, and a readable JSON file.
func round3(f float64) float64 {
	return float64(int64(f*1000+0.5)) / 1000
}

// SizeName writes a payload size as the reports do: 64 B, 4 KiB, 16 MiB.
func SizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// DurName writes a latency as the reports do, three significant digits or so: 31.2 µs,
// 1.34 ms.
func DurName(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", ns)
	case d < 100*time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(ns)/1e3)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(ns)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(ns)/1e6)
	}
	return fmt.Sprintf("%.2f s", float64(ns)/1e9)
}
