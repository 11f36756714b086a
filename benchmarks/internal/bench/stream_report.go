package bench

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// findStream returns the streaming result of system in direction dir.
func (r *Report) findStream(system, dir string) *StreamResult {
	for i := range r.StreamResults {
		if res := &r.StreamResults[i]; res.System == system && res.Direction == dir {
			return res
		}
	}
	return nil
}

// streamSystems returns the systems of the streaming results, in Systems order.
func (r *Report) streamSystems() []string {
	var out []string
	for _, s := range SystemNames() {
		if slices.ContainsFunc(r.StreamResults, func(x StreamResult) bool { return x.System == s }) {
			out = append(out, s)
		}
	}
	return out
}

// StreamTargets evaluates the streaming cell's goals for each of its mwrpc systems:
// server-stream throughput at least 2x gRPC-Go's and at least 0.7x raw TCP's.
func (r *Report) StreamTargets() []Goal {
	var ts []Goal
	for _, sys := range r.streamSystems() {
		if !strings.HasPrefix(sys, "mwrpc") {
			continue
		}
		s := r.findStream(sys, DirServerStream)
		for _, base := range []struct {
			name string
			want float64
		}{{"grpc", 2}, {"rawtcp", 0.7}} {
			if b := r.findStream(base.name, DirServerStream); s != nil && b != nil && b.MBPerSec > 0 {
				ts = append(ts, Goal{What: fmt.Sprintf("server-stream MB/s, %s ÷ %s", sys, base.name),
					Want: base.want, Unit: "x", Got: s.MBPerSec / b.MBPerSec})
			}
		}
	}
	return ts
}

// writeStreams writes the streaming cell's section: how it was run, a table of the
// systems, and the targets.
func (r *Report) writeStreams(ew *errWriter) {
	systems := r.streamSystems()
	if len(systems) == 0 {
		return
	}
	s := r.Setup
	ew.printf("\n## Streaming (%s)\n\n", s.Mode)
	where := "each system's bulk server in a process of its own, started by the harness"
	cpu := "user+system time per GiB moved, of the client (getrusage of the harness's process) and of the server process (/proc/PID/stat, 10 ms ticks)"
	if s.Mode == ModeInProcess {
		where = "client and server in the harness's one process"
		cpu = "user+system time per GiB moved, of the harness's one process (both sides)"
	}
	ew.printf("- One stream at a time over one connection, %s. Per round and system: a **server stream** (the client asks, the server sends %s in %s messages, the client reads each and checks its length and last byte) and a **client stream** (the client sends %s in %s messages, the server reads and checks each, then answers once with the count). %d round(s), systems interleaved (order rotated every round); figures are medians across rounds.\n",
		where, SizeName64(s.StreamBytes), SizeName(s.StreamChunkBytes), SizeName64(s.StreamBytes), SizeName(s.StreamChunkBytes), s.Rounds)
	ew.printf("- MB/s: payload bytes over the transfer's wall time (10^6 bytes a second). CPU s/GiB: %s.\n", cpu)
	ew.printf("\nSystems:\n\n")
	for _, si := range s.StreamSystems {
		ew.printf("- `%s`: %s\n", si.Name, si.Desc)
	}
	ew.printf("\n| system | server-stream MB/s | client-stream MB/s | client CPU s/GiB (server-stream / client-stream) | server CPU s/GiB (server-stream / client-stream) | ÷ rawtcp (server-stream / client-stream) | ÷ grpc (server-stream / client-stream) |\n")
	ew.printf("|---|---:|---:|---:|---:|---:|---:|\n")
	ratio := func(sys, base string) string {
		var parts []string
		for _, dir := range []string{DirServerStream, DirClientStream} {
			x, b := r.findStream(sys, dir), r.findStream(base, dir)
			if x == nil || b == nil || b.MBPerSec <= 0 {
				parts = append(parts, "–")
				continue
			}
			parts = append(parts, fmt.Sprintf("%.2fx", x.MBPerSec/b.MBPerSec))
		}
		return strings.Join(parts, " / ")
	}
	for _, sys := range systems {
		down, up := r.findStream(sys, DirServerStream), r.findStream(sys, DirClientStream)
		ew.printf("| %s | %s | %s | %s | %s | %s | %s |\n", sys,
			streamRate(down), streamRate(up),
			streamPair(down, up, func(x *StreamResult) *float64 { return &x.ClientCPUSecPerGiB }),
			streamPair(down, up, func(x *StreamResult) *float64 { return x.ServerCPUSecPerGiB }),
			ratio(sys, "rawtcp"), ratio(sys, "grpc"))
	}
	if ts := r.StreamTargets(); len(ts) > 0 {
		ew.printf("\nTargets (server-stream throughput: at least 2x gRPC-Go's and 0.7x raw TCP's):\n\n")
		for _, t := range ts {
			verdict := "**missed**"
			if t.Met() {
				verdict = "met"
			}
			ew.printf("- %s: %.2fx, target at least %gx: %s\n", t.What, t.Got, t.Want, verdict)
		}
	}
}

func streamRate(x *StreamResult) string {
	if x == nil {
		return ""
	}
	return fmtRate(x.MBPerSec)
}

// streamPair writes a figure of both directions: "0.41 / 0.52".
func streamPair(down, up *StreamResult, f func(*StreamResult) *float64) string {
	one := func(x *StreamResult) string {
		if x == nil {
			return "–"
		}
		v := f(x)
		if v == nil {
			return "–"
		}
		return fmt.Sprintf("%.2f", *v)
	}
	return one(down) + " / " + one(up)
}

// ChartStream is the streaming cell's chart: MB/s per system, both directions.
const ChartStream = "stream_mbps.png"

// WriteStreamChart draws the streaming results into dir as ChartStream and returns the
// file written, or "" when there are none.
func WriteStreamChart(dir string, mode Mode, results []StreamResult) (string, error) {
	r := &Report{StreamResults: results}
	systems := r.streamSystems()
	if len(systems) == 0 {
		return "", nil
	}
	total := results[0].TotalBytes
	c := newChart(fmt.Sprintf("Streaming %s in %s messages, one stream (%s)", SizeName64(total), SizeName(results[0].ChunkBytes), mode),
		"", "MB/s (10^6 bytes)")
	const barWidth = 18
	for i, dir := range []string{DirServerStream, DirClientStream} {
		vals := make(plotter.Values, len(systems))
		for j, sys := range systems {
			if x := r.findStream(sys, dir); x != nil {
				vals[j] = x.MBPerSec
			}
		}
		bars, err := plotter.NewBarChart(vals, vg.Points(barWidth))
		if err != nil {
			return "", fmt.Errorf("chart %s: %w", ChartStream, err)
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = vg.Points(float64(barWidth) * (float64(i) - 0.5))
		c.p.Add(bars)
		c.leg.Add(dir, bars)
	}
	c.p.NominalX(systems...)
	c.p.X.Min, c.p.X.Max = -0.6, float64(len(systems))-0.4
	c.p.Y.Min = 0
	c.p.Y.Max *= 1.1
	c.p.Y.Tick.Marker = relabel{plot.DefaultTicks{}, func(v float64) string { return fmt.Sprintf("%g", v) }}
	path := filepath.Join(dir, ChartStream)
	if err := c.save(path); err != nil {
		return "", fmt.Errorf("chart %s: %w", ChartStream, err)
	}
	return path, nil
}
