package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is latest.json.
type Report struct {
	Machine Machine  `json:"machine"`
	Setup   Setup    `json:"setup"`
	Results []Result `json:"results"` // the echo matrix
	// StreamResults is the streaming cell: one per system and direction.
	StreamResults []StreamResult `json:"stream_results,omitempty"`
}

// Setup is how the run was made.
type Setup struct {
	Command string `json:"command"`
	Source  string `json:"source,omitempty"` // the mwrpc tree measured: commit, and whether it had uncommitted changes
	// Mode is where the servers ran: "two-process" (each system's server in a process of
	// its own) or "inproc" (client and server in one process).
	Mode Mode `json:"mode"`
	// Sides says what allocs/op, CPU/op and copied B/op cover in the mode.
	Sides string `json:"sides"`
	// LeftOut names the systems asked for that the mode cannot run (mwrpc-inproc in
	// two-process mode).
	LeftOut          []string     `json:"left_out,omitempty"`
	Systems          []SystemInfo `json:"systems"`
	Payloads         []int        `json:"payloads"`
	Concurrency      []int        `json:"concurrency"`
	DurationNs       int64        `json:"duration_ns"` // measured, per system per round
	WarmupNs         int64        `json:"warmup_ns"`   // per system per cell
	Rounds           int          `json:"rounds"`
	MaxInflightBytes int64        `json:"max_inflight_bytes"`
	SkippedCells     []string     `json:"skipped_cells"`
	WallSeconds      float64      `json:"wall_seconds"`
	// LoadAvg is /proc/loadavg's 1-minute figure at the start and the end of the run: how
	// busy the (shared) machine was besides this run.
	LoadAvg [2]float64 `json:"loadavg_start_end"`
	Notes   []string   `json:"notes"`
	// Cells are the kinds of cells run: "echo" (the matrix above), "stream" (the
	// streaming cell below).
	Cells []CellKind `json:"cells"`
	// The streaming cell: bytes per transfer, bytes per message, and its systems (how
	// each streams). It runs in Mode too, with Rounds rounds.
	StreamBytes      int64        `json:"stream_bytes,omitempty"`
	StreamChunkBytes int          `json:"stream_chunk_bytes,omitempty"`
	StreamSystems    []SystemInfo `json:"stream_systems,omitempty"`
}

// SystemInfo names a system in the report.
type SystemInfo struct {
	Name string `json:"name"`
	Desc string `json:"desc"`
}

// WriteJSON writes the report as indented JSON to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteMarkdown writes the report as markdown (latest.md); charts are the chart files to
// link, relative to the markdown file's directory.
func (r *Report) WriteMarkdown(w io.Writer, charts []string) error {
	ew := &errWriter{w: w}
	m := r.Machine
	ew.printf("# mwrpcbench results (%s)\n\n", r.Setup.Mode)
	ew.printf("- Machine: %s, %d CPUs, GOMAXPROCS %d, %s %s/%s", m.CPUModel, m.NumCPU, m.GOMAXPROCS, m.GoVersion, m.OS, m.Arch)
	if m.Kernel != "" {
		ew.printf(", Linux %s", m.Kernel)
	}
	ew.printf("; %s.\n", m.Date)
	s := r.Setup
	ew.printf("- Command: `%s` (%.0f s wall)", s.Command, s.WallSeconds)
	if s.Source != "" {
		ew.printf("; mwrpc at %s", s.Source)
	}
	ew.printf(".\n")
	ew.printf("- 1-minute load average %.2f at the start, %.2f at the end (this run alone keeps it near 1-2).\n", s.LoadAvg[0], s.LoadAvg[1])
	echo := len(r.Results) > 0
	if !echo {
		ew.printf("- Mode: **%s**. Cells: %s.\n", s.Mode, joinCells(s.Cells))
		for _, n := range s.Notes {
			ew.printf("- %s\n", n)
		}
		r.writeStreams(ew)
		r.writeGoals(ew)
		r.writeCharts(ew, charts)
		return ew.err
	}
	ew.printf("- Per cell: every system set up, warmed up for %v, then measured %d round(s) of %v each, systems interleaved (order rotated every round); figures are medians across rounds.\n",
		time.Duration(s.WarmupNs), s.Rounds, time.Duration(s.DurationNs))
	ew.printf("- Mode: **%s**. %s%s.\n", s.Mode, strings.ToUpper(s.Sides[:1]), s.Sides[1:])
	if len(s.LeftOut) > 0 {
		ew.printf("- Not run in this mode (in-process only): %s.\n", strings.Join(s.LeftOut, ", "))
	}
	ew.printf("- MB/s counts request and response payloads (2 × payload per call, 10^6 bytes); copied B/op is what the soft provider counts (socket tx + rx + in-process copies + copies placed in or pulled from a same-host peer's shared memory, of the devices in this process), empty for systems without such counters.\n")
	for _, n := range s.Notes {
		ew.printf("- %s\n", n)
	}
	if len(s.SkippedCells) > 0 {
		ew.printf("- Skipped (payload × concurrency above %s in flight per direction): %s.\n",
			SizeName(int(s.MaxInflightBytes)), strings.Join(s.SkippedCells, ", "))
	}
	ew.printf("\nSystems:\n\n")
	for _, si := range s.Systems {
		ew.printf("- `%s`: %s\n", si.Name, si.Desc)
	}

	ew.printf("\n## Results\n\n")
	ew.printf("| system | payload | conc | p50 | p99 | p99.9 | ops/s | MB/s | allocs/op | alloc B/op | CPU/op | server CPU/op | copied B/op |\n")
	ew.printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.sorted() {
		copied := ""
		if res.CopiedBytesPerOp != nil {
			copied = fmtCount(*res.CopiedBytesPerOp)
		}
		scpu := ""
		if res.ServerCPUNsPerOp != nil {
			scpu = DurName(int64(*res.ServerCPUNsPerOp))
		}
		ew.printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			res.System, SizeName(res.PayloadBytes), res.Concurrency,
			DurName(res.P50Ns), DurName(res.P99Ns), DurName(res.P999Ns),
			fmtCount(res.OpsPerSec), fmtRate(res.MBPerSec), fmtAllocs(res.AllocsPerOp),
			fmtCount(res.AllocBytesPerOp), DurName(int64(res.CPUNsPerOp)), scpu, copied)
	}

	r.writeStarved(ew)
	r.writeVersus(ew, "mwrpc-tcp", "grpc")
	r.writeFloor(ew, "rawtcp")
	r.writeStreams(ew)
	r.writeGoals(ew)
	r.writeCharts(ew, charts)
	return ew.err
}

// writeStarved names the rows whose harness or server process was starved (see starved):
// on a shared machine their tails and throughput show the other load, not the system (a
// multi-second p99.9 there is threads that could not run).
func (r *Report) writeStarved(ew *errWriter) {
	var rows []string
	for _, res := range r.sorted() {
		c, s := msPerS(res.RunQueueMsPerS), msPerS(res.ServerRunQueueMsPerS)
		ccpu := res.CPUNsPerOp * res.OpsPerSec / 1e6
		scpu := 0.0
		if res.ServerCPUNsPerOp != nil {
			scpu = *res.ServerCPUNsPerOp * res.OpsPerSec / 1e6
		}
		if starved(c, ccpu) || starved(s, scpu) {
			rows = append(rows, fmt.Sprintf("%s %s c%d (harness waited %.0f ran %.0f, server waited %.0f ran %.0f)",
				res.System, SizeName(res.PayloadBytes), res.Concurrency, c, ccpu, s, scpu))
		}
	}
	if len(rows) == 0 {
		return
	}
	ew.printf("\nStarved by the machine (a process's threads waited for a CPU at least %d times as long as they ran; ms per second of the round, Linux schedstat): %s. Their latency and ops/s measure the other load as much as the system.\n",
		starvedRatio, strings.Join(rows, "; "))
}

// msPerS is a run-queue figure, 0 when unknown.
func msPerS(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

// writeCharts links the charts.
func (r *Report) writeCharts(ew *errWriter, charts []string) {
	if len(charts) == 0 {
		return
	}
	ew.printf("\n## Charts\n\n")
	for _, c := range charts {
		name := filepath.Base(c)
		ew.printf("![%s](%s)\n\n", strings.TrimSuffix(name, ".png"), name)
	}
}

func joinCells(cells []CellKind) string {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}

// sorted returns the results by payload, then concurrency, then system (in Systems order).
func (r *Report) sorted() []Result {
	order := SystemNames()
	out := slices.Clone(r.Results)
	slices.SortStableFunc(out, func(a, b Result) int {
		if a.PayloadBytes != b.PayloadBytes {
			return a.PayloadBytes - b.PayloadBytes
		}
		if a.Concurrency != b.Concurrency {
			return a.Concurrency - b.Concurrency
		}
		return slices.Index(order, a.System) - slices.Index(order, b.System)
	})
	return out
}

func (r *Report) find(system string, c Cell) *Result {
	for i := range r.Results {
		if res := &r.Results[i]; res.System == system && res.Cell() == c {
			return res
		}
	}
	return nil
}

// cells returns the cells of the results, in matrix order.
func (r *Report) cells() []Cell {
	var cells []Cell
	for _, res := range r.sorted() {
		if !slices.Contains(cells, res.Cell()) {
			cells = append(cells, res.Cell())
		}
	}
	return cells
}

// Targets evaluates the in-process goals of sys against base (mwrpc over soft TCP
// against gRPC-Go, factors by which sys must be better) where the results have the cells.
func (r *Report) Targets(sys, base string) []Goal {
	var ts []Goal
	ratio := func(what string, c Cell, want float64, f func(s, b *Result) float64) {
		s, b := r.find(sys, c), r.find(base, c)
		if s != nil && b != nil {
			ts = append(ts, Goal{What: what, Where: c.String(), Want: want, Unit: "x", Got: f(s, b)})
		}
	}
	lower := func(s, b *Result) float64 { return float64(b.P50Ns) / float64(s.P50Ns) }
	ratio("p50 latency, "+base+" ÷ "+sys, Cell{64, 1}, 2, lower)
	ratio("p50 latency, "+base+" ÷ "+sys, Cell{1 << 20, 1}, 3, lower)
	ratio("ops/s, "+sys+" ÷ "+base, Cell{64, 64}, 2, func(s, b *Result) float64 { return s.OpsPerSec / b.OpsPerSec })
	worst := Goal{What: "allocs/op, " + base + " ÷ " + sys + " (worst cell)", Want: 10, Unit: "x", Got: math.Inf(1)}
	for _, c := range r.cells() {
		s, b := r.find(sys, c), r.find(base, c)
		if s == nil || b == nil {
			continue
		}
		if g := b.AllocsPerOp / math.Max(s.AllocsPerOp, 0.001); g < worst.Got {
			worst.Got, worst.Where = g, c.String()
		}
	}
	if !math.IsInf(worst.Got, 1) {
		ts = append(ts, worst)
	}
	return ts
}

// writeVersus compares sys with base cell by cell, then against the targets.
func (r *Report) writeVersus(ew *errWriter, sys, base string) {
	var rows []string
	for _, c := range r.cells() {
		s, b := r.find(sys, c), r.find(base, c)
		if s == nil || b == nil {
			continue
		}
		rows = append(rows, fmt.Sprintf("| %s | %d | %.2fx | %.2fx | %.2fx | %.2fx | %.1fx | %.2fx |",
			SizeName(c.Payload), c.Concurrency,
			float64(b.P50Ns)/float64(s.P50Ns), float64(b.P99Ns)/float64(s.P99Ns),
			s.OpsPerSec/b.OpsPerSec, s.MBPerSec/b.MBPerSec,
			b.AllocsPerOp/math.Max(s.AllocsPerOp, 0.001), b.CPUNsPerOp/s.CPUNsPerOp))
	}
	if len(rows) == 0 {
		return
	}
	ew.printf("\n## %s against %s\n\n", sys, base)
	ew.printf("Factors by which %s is better (above 1) or worse (below 1) than %s, same run.\n\n", sys, base)
	ew.printf("| payload | conc | p50 lower by | p99 lower by | ops/s higher by | MB/s higher by | allocs/op fewer by | CPU/op lower by |\n")
	ew.printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range rows {
		ew.printf("%s\n", row)
	}
	if ts := r.Targets(sys, base); len(ts) > 0 {
		if r.Setup.Mode == ModeTwoProcess {
			ew.printf("\nTargets (set for in-process figures; the two-process goals are in the Goals section below):\n\n")
		} else {
			ew.printf("\nTargets:\n\n")
		}
		for _, t := range ts {
			verdict := "**missed**"
			if t.Met() {
				verdict = "met"
			}
			ew.printf("- %s at %s: %.2fx, target at least %gx: %s\n", t.What, t.Where, t.Got, t.Want, verdict)
		}
	}
}

// writeFloor shows each system's p50 and ops/s as multiples of the floor's, same run.
func (r *Report) writeFloor(ew *errWriter, floor string) {
	var systems []string
	for _, s := range SystemNames() {
		if s != floor && slices.ContainsFunc(r.Results, func(x Result) bool { return x.System == s }) {
			systems = append(systems, s)
		}
	}
	if len(systems) == 0 {
		return
	}
	table := func(title, what string, base func(*Result) string, factor func(x, f *Result) float64) {
		var rows []string
		for _, c := range r.cells() {
			f := r.find(floor, c)
			if f == nil {
				continue
			}
			row := fmt.Sprintf("| %s | %d | %s |", SizeName(c.Payload), c.Concurrency, base(f))
			for _, s := range systems {
				if x := r.find(s, c); x != nil {
					row += fmt.Sprintf(" %.2fx |", factor(x, f))
				} else {
					row += " |"
				}
			}
			rows = append(rows, row)
		}
		if len(rows) == 0 {
			return
		}
		ew.printf("\n## %s against the floor (%s)\n\n", title, floor)
		ew.printf("| payload | conc | %s %s | %s |\n", floor, what, strings.Join(systems, " | "))
		ew.printf("|---:|---:|---:|%s\n", strings.Repeat("---:|", len(systems)))
		for _, row := range rows {
			ew.printf("%s\n", row)
		}
	}
	table("p50", "p50", func(f *Result) string { return DurName(f.P50Ns) },
		func(x, f *Result) float64 { return float64(x.P50Ns) / float64(f.P50Ns) })
	table("ops/s", "ops/s", func(f *Result) string { return fmtCount(f.OpsPerSec) },
		func(x, f *Result) float64 { return x.OpsPerSec / f.OpsPerSec })
}

func fmtCount(f float64) string {
	switch {
	case f >= 1e6:
		return fmt.Sprintf("%.2fM", f/1e6)
	case f >= 1e4:
		return fmt.Sprintf("%.1fk", f/1e3)
	case f >= 100:
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.1f", f)
}

func fmtRate(f float64) string {
	if f >= 100 {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.2f", f)
}

func fmtAllocs(f float64) string {
	if f >= 100 {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.1f", f)
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
