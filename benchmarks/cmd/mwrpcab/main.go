// Command mwrpcab compares two harness builds measured in alternating runs (A/B): the
// reports (latest.json) of the base build's runs and of the new build's, in the order they
// were made, so that the i-th run of each is a pair that ran back to back. Per cell
// (payload, concurrency, system) it prints the median of each build's runs and their
// ratio for p50 and calls/s, how many pairs the new build did more calls in, and the
// medians of allocations, client CPU and server CPU per call; per streaming system and
// direction, the median MB/s of each build. A machine as noisy as a shared VM or a fresh
// lease moves single runs by 10-40%: the pairs column says whether a ratio is the builds'
// or the noise's.
//
// With -control SYSTEM (a system that is the same code in both builds, shmipc-go or raw
// TCP), a pair of runs is steady in a cell when the control's calls/s in that cell moved
// by at most 10% between them; the steady column is the median of the new build's calls/s
// over the base's in the steady pairs alone. A whole run that fell into a slower mode of
// the machine (as the 2-core development VM's runs do at 64 KiB) then counts in neither
// build's figures. The "÷ control" column reads every run instead: a system's calls/s
// over the control's in the same run and cell, the median of each build's runs, and their
// ratio; a swing of the whole run, which moves both systems, cancels out of it.
//
//	mwrpcab -base 'results/ab/base-*/latest.json' -new 'results/ab/new-*/latest.json' [-control shmipc]
//
// scripts/manycore-ab.sh makes such runs on a many-core machine and runs this command
// there.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mwrpc/mwrpc/benchmarks/internal/bench"
)

func main() {
	base := flag.String("base", "", "glob of the base build's reports (latest.json), in the order the runs were made")
	next := flag.String("new", "", "glob of the new build's reports, likewise")
	control := flag.String("control", "", "a system that is the same code in both builds: the steady column compares only pairs in which its calls/s moved by at most 10%")
	flag.Parse()
	if err := run(os.Stdout, *base, *next, *control); err != nil {
		fmt.Fprintln(os.Stderr, "mwrpcab:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, baseGlob, newGlob, control string) error {
	if baseGlob == "" || newGlob == "" {
		return fmt.Errorf("both -base and -new are needed (globs of latest.json files)")
	}
	base, err := load(baseGlob)
	if err != nil {
		return err
	}
	next, err := load(newGlob)
	if err != nil {
		return err
	}
	cells := compareEcho(base, next, control)
	streams := compareStream(base, next)
	if len(cells) == 0 && len(streams) == 0 {
		return fmt.Errorf("no cell or streaming system is in both %s and %s", baseGlob, newGlob)
	}
	if control != "" && !slices.ContainsFunc(cells, func(c cellAB) bool { return c.key.system == control }) {
		return fmt.Errorf("-control %s: no cell of that system is in both builds' reports", control)
	}
	write(w, base, next, cells, streams, control)
	return nil
}

// load reads the reports a glob names, sorted by name (the order of the runs when they are
// numbered base-1, base-2, ...).
func load(glob string) ([]bench.Report, error) {
	files, err := filepath.Glob(glob)
	if err != nil {
		return nil, fmt.Errorf("glob %q: %w", glob, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no report matches %q", glob)
	}
	slices.Sort(files)
	reps := make([]bench.Report, len(files))
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &reps[i]); err != nil {
			return nil, fmt.Errorf("%s: not a harness report: %w", f, err)
		}
	}
	return reps, nil
}

// cellKey names an echo cell of one system.
type cellKey struct {
	payload, conc int
	system        string
}

// streamKey names a streaming system and direction.
type streamKey struct{ system, direction string }

// byBuild is what each build's runs gave for one key, one entry a run that had it.
type byBuild[V any] struct{ base, next []V }

// group collects, for each key that each(report) yields, the values of the base build's
// runs and of the new build's; keys come out in the order first seen, and only those both
// builds have.
func group[K comparable, V any](base, next []bench.Report, each func(bench.Report, func(K, V))) ([]K, map[K]*byBuild[V]) {
	m := map[K]*byBuild[V]{}
	var keys []K
	add := func(reps []bench.Report, side func(*byBuild[V]) *[]V) {
		for _, rep := range reps {
			each(rep, func(k K, v V) {
				g, ok := m[k]
				if !ok {
					g = &byBuild[V]{}
					m[k] = g
					keys = append(keys, k)
				}
				*side(g) = append(*side(g), v)
			})
		}
	}
	add(base, func(g *byBuild[V]) *[]V { return &g.base })
	add(next, func(g *byBuild[V]) *[]V { return &g.next })
	both := keys[:0]
	for _, k := range keys {
		if g := m[k]; len(g.base) > 0 && len(g.next) > 0 {
			both = append(both, k)
		}
	}
	return both, m
}

// cellAB is one cell's figures over the runs of both builds.
type cellAB struct {
	key cellKey
	byBuild[bench.Result]
	pairs, wins int       // pairs in which both ran the cell; of them, those the new build did more calls in
	steady      []float64 // new ÷ base calls/s in the pairs whose control moved by at most steadyBand
	// relBase and relNext are the cell's calls/s over the control's in the same run, one
	// entry a run of each build that measured both.
	relBase, relNext []float64
}

// steadyBand is how far the control's calls/s may move between the two runs of a steady
// pair.
const steadyBand = 0.10

func compareEcho(base, next []bench.Report, control string) []cellAB {
	keys, m := group(base, next, func(rep bench.Report, yield func(cellKey, bench.Result)) {
		for _, r := range rep.Results {
			yield(cellKey{r.PayloadBytes, r.Concurrency, r.System}, r)
		}
	})
	slices.SortFunc(keys, func(a, b cellKey) int {
		if a.payload != b.payload {
			return a.payload - b.payload
		}
		if a.conc != b.conc {
			return a.conc - b.conc
		}
		return strings.Compare(a.system, b.system)
	})
	out := make([]cellAB, len(keys))
	for i, k := range keys {
		out[i] = cellAB{key: k, byBuild: *m[k]}
		for p := range min(len(base), len(next)) {
			b, okb := find(base[p].Results, k)
			n, okn := find(next[p].Results, k)
			if okb && okn {
				out[i].pairs++
				if n.OpsPerSec > b.OpsPerSec {
					out[i].wins++
				}
				if control != "" && steadyPair(base[p], next[p], k, control) {
					out[i].steady = append(out[i].steady, n.OpsPerSec/b.OpsPerSec)
				}
			}
		}
		if control != "" {
			out[i].relBase, out[i].relNext = relToControl(base, k, control), relToControl(next, k, control)
		}
	}
	return out
}

// relToControl returns, for each run that measured k's cell of both its system and the
// control, the system's calls/s over the control's.
func relToControl(reps []bench.Report, k cellKey, control string) []float64 {
	ck := k
	ck.system = control
	var out []float64
	for _, rep := range reps {
		r, ok := find(rep.Results, k)
		c, okc := find(rep.Results, ck)
		if ok && okc && c.OpsPerSec > 0 {
			out = append(out, r.OpsPerSec/c.OpsPerSec)
		}
	}
	return out
}

// steadyPair reports whether the control system's calls/s in k's cell moved by at most
// steadyBand between the two runs of a pair.
func steadyPair(base, next bench.Report, k cellKey, control string) bool {
	k.system = control
	b, okb := find(base.Results, k)
	n, okn := find(next.Results, k)
	if !okb || !okn || b.OpsPerSec <= 0 {
		return false
	}
	r := n.OpsPerSec / b.OpsPerSec
	return r >= 1-steadyBand && r <= 1/(1-steadyBand)
}

func find(rs []bench.Result, k cellKey) (bench.Result, bool) {
	for _, r := range rs {
		if r.PayloadBytes == k.payload && r.Concurrency == k.conc && r.System == k.system {
			return r, true
		}
	}
	return bench.Result{}, false
}

// streamAB is one streaming system and direction's MB/s over the runs of both builds.
type streamAB struct {
	key streamKey
	byBuild[float64]
}

func compareStream(base, next []bench.Report) []streamAB {
	keys, m := group(base, next, func(rep bench.Report, yield func(streamKey, float64)) {
		for _, r := range rep.StreamResults {
			yield(streamKey{r.System, r.Direction}, r.MBPerSec)
		}
	})
	out := make([]streamAB, len(keys))
	for i, k := range keys {
		out[i] = streamAB{key: k, byBuild: *m[k]}
	}
	return out
}

// of returns f of each result.
func of(rs []bench.Result, f func(bench.Result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

func sources(reps []bench.Report) string {
	var s []string
	for _, r := range reps {
		if !slices.Contains(s, r.Setup.Source) {
			s = append(s, r.Setup.Source)
		}
	}
	return strings.Join(s, "; ")
}

func write(w io.Writer, base, next []bench.Report, cells []cellAB, streams []streamAB, control string) {
	fmt.Fprintf(w, "# A/B: %d runs of the base build, %d of the new\n\n", len(base), len(next))
	fmt.Fprintf(w, "- Base: %s\n- New: %s\n", sources(base), sources(next))
	if len(base) > 0 {
		m := base[0].Machine
		fmt.Fprintf(w, "- Machine: %s, %d CPUs, GOMAXPROCS %d, %s; first base run %s\n", m.CPUModel, m.NumCPU, m.GOMAXPROCS, m.GoVersion, m.Date)
	}
	fmt.Fprintf(w, "- Medians of each build's runs; \"pairs ahead\": the pairs of runs (the i-th of each) in which the new build did more calls/s. CPU/op: the client's process; server CPU/op: the server's.\n")
	controlHead, controlRule := "", ""
	if control != "" {
		fmt.Fprintf(w, "- Steady pairs: those in which %s, the same code in both builds, moved by at most %.0f%% in the cell; \"steady\" is the median new ÷ base calls/s over them.\n", control, steadyBand*100)
		fmt.Fprintf(w, "- \"÷ control\": the system's calls/s over %s's in the same run and cell, the median over each build's runs, base → new, and new ÷ base: what a swing of a whole run does to both cancels out.\n", control)
		controlHead, controlRule = " steady | ÷ control |", "---:|---:|"
	}
	if len(cells) > 0 {
		fmt.Fprintf(w, "\n| cell | system | p50 base | p50 new | new ÷ base | calls/s base | calls/s new | new ÷ base | pairs ahead |%s allocs/op base → new | CPU/op base → new | server CPU/op base → new |\n", controlHead)
		fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|%s---:|---:|---:|\n", controlRule)
		for _, c := range cells {
			p50 := func(r bench.Result) float64 { return float64(r.P50Ns) }
			ops := func(r bench.Result) float64 { return r.OpsPerSec }
			allocs := func(r bench.Result) float64 { return r.AllocsPerOp }
			cpu := func(r bench.Result) float64 { return r.CPUNsPerOp }
			srv := func(r bench.Result) float64 {
				if r.ServerCPUNsPerOp == nil {
					return 0
				}
				return *r.ServerCPUNsPerOp
			}
			ns := func(x float64) string { return bench.DurName(int64(x)) }
			pb, pn := bench.Median(of(c.base, p50)), bench.Median(of(c.next, p50))
			ob, on := bench.Median(of(c.base, ops)), bench.Median(of(c.next, ops))
			byControl := "" // the steady and ÷ control columns
			if control != "" {
				byControl = fmt.Sprintf(" - (0 of %d) |", c.pairs)
				if len(c.steady) > 0 {
					byControl = fmt.Sprintf(" %.2fx (%d of %d) |", bench.Median(c.steady), len(c.steady), c.pairs)
				}
				byControl += relColumn(c, control)
			}
			fmt.Fprintf(w, "| %s c%d | %s | %s | %s | %.2fx | %.0f | %.0f | %.2fx | %d of %d |%s %.1f → %.1f | %s → %s | %s → %s |\n",
				bench.SizeName(c.key.payload), c.key.conc, c.key.system,
				ns(pb), ns(pn), pn/pb, ob, on, on/ob, c.wins, c.pairs, byControl,
				bench.Median(of(c.base, allocs)), bench.Median(of(c.next, allocs)),
				ns(bench.Median(of(c.base, cpu))), ns(bench.Median(of(c.next, cpu))),
				ns(bench.Median(of(c.base, srv))), ns(bench.Median(of(c.next, srv))))
		}
	}
	if len(streams) > 0 {
		fmt.Fprintf(w, "\n| stream | direction | MB/s base | MB/s new | new ÷ base | runs base / new |\n|---|---|---:|---:|---:|---:|\n")
		for _, s := range streams {
			b, n := bench.Median(s.base), bench.Median(s.next)
			fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %.2fx | %d / %d |\n", s.key.system, s.key.direction, b, n, n/b, len(s.base), len(s.next))
		}
	}
}

// relColumn is a cell's "÷ control" column: "-" for the control itself and for a cell
// either build never measured beside it.
func relColumn(c cellAB, control string) string {
	if c.key.system == control || len(c.relBase) == 0 || len(c.relNext) == 0 {
		return " - |"
	}
	b, n := bench.Median(c.relBase), bench.Median(c.relNext)
	return fmt.Sprintf(" %.3f → %.3f (%.2fx) |", b, n, n/b)
}
