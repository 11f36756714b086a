// Command rxereport turns what `make bench-rxe` brought out of the Soft-RoCE VM into one
// table: the harness's results (latest.json: mwrpc-ibv, mwrpc-tcp and rawtcp in two
// processes inside the VM) beside perftest's latency on rxe0 (perftest.txt, one line per
// run: "TOOL #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%", in
// microseconds), and rxe0.txt (rxe0's packet counters around the harness) and host.txt
// (the load of the machine running the VM) where they are. It writes rxe.md and rxe.json into the directory and prints the markdown.
//
//	go run ./cmd/rxereport -dir results/rxe
//
// Per system, payload and concurrency the table shows p50, p99 and ops/s (medians across
// the harness's rounds), their ratios to rawtcp's in the same cell, and at concurrency 1
// the p50's ratio to the perftest floor: the verbs one echo call needs, each measured
// alone by perftest (medians of its t_typical across runs). A call whose payload goes
// inside the SEND (below 16 KiB: the transport's default eager threshold is a 16 KiB
// slot less the headers) is a SEND each way: 2 × ib_send_lat at the payload's size
// (ib_send_lat reports half a round trip). A larger payload is exposed through a memory
// window and READ by the peer, each way: 2 × ib_send_lat at 64 B plus 2 × ib_read_lat at
// the payload's size. The floor leaves out what mwrpc adds (window binds and
// invalidations, the rpc envelope, Go's scheduling, the harness's clock reads).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/mwrpc/mwrpc/benchmarks/internal/bench"
)

// eagerMax bounds the payloads the transport sends inside a SEND by default
// (transport.DefaultEagerThreshold: a 16 KiB slot less the headers and the rpc envelope).
const eagerMax = 16 << 10

func main() {
	dir := flag.String("dir", filepath.Join("results", "rxe"), "directory with latest.json and perftest.txt; rxe.md and rxe.json are written there")
	flag.Parse()
	if err := run(*dir, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rxereport:", err)
		os.Exit(1)
	}
}

// Perftest is one perftest tool at one size: medians across its runs.
type Perftest struct {
	Tool  string `json:"tool"`
	Bytes int    `json:"bytes"`
	Runs  int    `json:"runs"`
	// TypicalUs is the median of the runs' t_typical (perftest's median latency), and
	// P99Us of their 99% percentiles, in microseconds. ib_send_lat's are half a round trip.
	TypicalUs float64   `json:"t_typical_us"`
	P99Us     float64   `json:"p99_us"`
	RunsUs    []float64 `json:"runs_t_typical_us"`
}

// Row is one system in one cell, with its ratios.
type Row struct {
	System       string  `json:"system"`
	PayloadBytes int     `json:"payload_bytes"`
	Concurrency  int     `json:"concurrency"`
	P50Us        float64 `json:"p50_us"`
	P99Us        float64 `json:"p99_us"`
	OpsPerSec    float64 `json:"ops_per_sec"`
	// Calls is how many calls the rounds measured together (p99 of few calls is their
	// slowest).
	Calls int64 `json:"calls"`
	// P50VsRawTCP and OpsVsRawTCP are the ratios to rawtcp's p50 and ops/s in the cell;
	// P50VsFloor the ratio to the perftest floor (concurrency 1). Zero: not measured.
	P50VsRawTCP float64 `json:"p50_vs_rawtcp,omitempty"`
	OpsVsRawTCP float64 `json:"ops_vs_rawtcp,omitempty"`
	P50VsFloor  float64 `json:"p50_vs_perftest_floor,omitempty"`
}

// Floor is the perftest round trip one echo call of a payload needs.
type Floor struct {
	PayloadBytes int     `json:"payload_bytes"`
	Us           float64 `json:"us"`
	How          string  `json:"how"`
}

// Summary is rxe.json.
type Summary struct {
	Machine  bench.Machine `json:"machine"`
	Command  string        `json:"command"`
	Source   string        `json:"source,omitempty"`
	Notes    []string      `json:"notes"`
	Perftest []Perftest    `json:"perftest"`
	Floors   []Floor       `json:"floors"`
	Rows     []Row         `json:"rows"`
}

func run(dir string, stdout io.Writer) error {
	var rep bench.Report
	b, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	if err != nil {
		return fmt.Errorf("read the harness's results: %w", err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("latest.json: %w", err)
	}
	f, err := os.Open(filepath.Join(dir, "perftest.txt"))
	if err != nil {
		return fmt.Errorf("read perftest's results: %w", err)
	}
	pts, dropped, err := parsePerftest(f)
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("perftest.txt: %w", err)
	}
	s := summarize(&rep, pts)
	if dropped > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d perftest run(s) printed no finite latency (inf) and are left out of the medians.", dropped))
	}
	// rxe0.txt, where the guest left it: rxe0's packet counters around the harness;
	// host.txt: the load of the machine running the VM.
	if b, err := os.ReadFile(filepath.Join(dir, "rxe0.txt")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		s.Notes = append(s.Notes, strings.TrimSpace(string(b))+" (mwrpc-ibv's calls; mwrpc-tcp, rawtcp and connection setup use loopback TCP).")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "host.txt")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		s.Notes = append(s.Notes, strings.TrimSpace(string(b)))
	}
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "rxe.json"), append(out, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	writeMarkdown(&md, s)
	if err := os.WriteFile(filepath.Join(dir, "rxe.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md.String())
	return err
}

// parsePerftest reads perftest.txt and returns one Perftest per tool and size, by tool
// and size, and how many runs it left out for want of a finite result.
func parsePerftest(r io.Reader) (_ []Perftest, dropped int, _ error) {
	type key struct {
		tool  string
		bytes int
	}
	var order []key
	typ, p99 := map[key][]float64{}, map[key][]float64{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 9 {
			return nil, 0, fmt.Errorf("line %d: %d fields, want 10", n, len(f))
		}
		size, err := strconv.Atoi(f[1])
		if err != nil {
			return nil, 0, fmt.Errorf("line %d: bytes: %w", n, err)
		}
		t, err := strconv.ParseFloat(f[5], 64)
		if err != nil {
			return nil, 0, fmt.Errorf("line %d: t_typical: %w", n, err)
		}
		p, err := strconv.ParseFloat(f[8], 64)
		if err != nil {
			return nil, 0, fmt.Errorf("line %d: 99%% percentile: %w", n, err)
		}
		if math.IsInf(t, 0) || math.IsNaN(t) || math.IsInf(p, 0) || math.IsNaN(p) {
			dropped++ // perftest prints inf when its clock failed it: no result
			continue
		}
		k := key{f[0], size}
		if _, ok := typ[k]; !ok {
			order = append(order, k)
		}
		typ[k] = append(typ[k], t)
		p99[k] = append(p99[k], p)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	slices.SortFunc(order, func(a, b key) int {
		if c := strings.Compare(a.tool, b.tool); c != 0 {
			return c
		}
		return a.bytes - b.bytes
	})
	var out []Perftest
	for _, k := range order {
		out = append(out, Perftest{Tool: k.tool, Bytes: k.bytes, Runs: len(typ[k]),
			TypicalUs: bench.Median(typ[k]), P99Us: bench.Median(p99[k]), RunsUs: typ[k]})
	}
	return out, dropped, nil
}

// floor returns the perftest round trip of one echo call of size bytes, if perftest
// measured what it needs.
func floor(pts []Perftest, size int) (Floor, bool) {
	get := func(tool string, bytes int) (float64, bool) {
		i := slices.IndexFunc(pts, func(p Perftest) bool { return p.Tool == tool && p.Bytes == bytes })
		if i < 0 {
			return 0, false
		}
		return pts[i].TypicalUs, true
	}
	if size < eagerMax {
		s, ok := get("ib_send_lat", size)
		return Floor{size, 2 * s, fmt.Sprintf("2 × ib_send_lat %s (a SEND each way)", bench.SizeName(size))}, ok
	}
	s, ok1 := get("ib_send_lat", 64)
	r, ok2 := get("ib_read_lat", size)
	return Floor{size, 2*s + 2*r, fmt.Sprintf("2 × ib_send_lat 64 B + 2 × ib_read_lat %s (a SEND and a READ each way)", bench.SizeName(size))}, ok1 && ok2
}

func summarize(rep *bench.Report, pts []Perftest) *Summary {
	s := &Summary{Machine: rep.Machine, Command: rep.Setup.Command, Source: rep.Setup.Source, Notes: rep.Setup.Notes, Perftest: pts}
	floors := map[int]Floor{}
	for _, p := range rep.Setup.Payloads {
		if f, ok := floor(pts, p); ok {
			floors[p] = f
			s.Floors = append(s.Floors, f)
		}
	}
	raw := map[bench.Cell]bench.Result{}
	for _, r := range rep.Results {
		if r.System == "rawtcp" {
			raw[r.Cell()] = r
		}
	}
	sysOrder := func(name string) int {
		return slices.IndexFunc(rep.Setup.Systems, func(si bench.SystemInfo) bool { return si.Name == name })
	}
	res := slices.Clone(rep.Results)
	slices.SortStableFunc(res, func(a, b bench.Result) int {
		if a.PayloadBytes != b.PayloadBytes {
			return a.PayloadBytes - b.PayloadBytes
		}
		if a.Concurrency != b.Concurrency {
			return a.Concurrency - b.Concurrency
		}
		return sysOrder(a.System) - sysOrder(b.System)
	})
	for _, r := range res {
		row := Row{System: r.System, PayloadBytes: r.PayloadBytes, Concurrency: r.Concurrency,
			P50Us: us(r.P50Ns), P99Us: us(r.P99Ns), OpsPerSec: r.OpsPerSec, Calls: r.Ops}
		if rt, ok := raw[r.Cell()]; ok && rt.P50Ns > 0 && rt.OpsPerSec > 0 {
			row.P50VsRawTCP = round2(float64(r.P50Ns) / float64(rt.P50Ns))
			row.OpsVsRawTCP = round2(r.OpsPerSec / rt.OpsPerSec)
		}
		if f, ok := floors[r.PayloadBytes]; ok && r.Concurrency == 1 && f.Us > 0 {
			row.P50VsFloor = round2(row.P50Us / f.Us)
		}
		s.Rows = append(s.Rows, row)
	}
	return s
}

func us(ns int64) float64      { return float64(ns/10) / 100 }
func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

func writeMarkdown(w *strings.Builder, s *Summary) {
	m := s.Machine
	fmt.Fprintf(w, "# mwrpc over Soft-RoCE (rxe) in two processes\n\n")
	fmt.Fprintf(w, "- Inside the rxe VM (`make bench-rxe`): %s, %d vCPUs, %s, Linux %s; %s.\n", m.CPUModel, m.NumCPU, m.GoVersion, m.Kernel, m.Date)
	fmt.Fprintf(w, "- Harness: `%s`", s.Command)
	if s.Source != "" {
		fmt.Fprintf(w, "; mwrpc at %s", s.Source)
	}
	fmt.Fprintf(w, ". Each system's server in a process of its own; p50, p99 and ops/s are medians across rounds, calls their total.\n")
	for _, n := range s.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	fmt.Fprintf(w, "- rxe is a software RDMA NIC in the kernel (verbs over UDP, here over a dummy netdev), and the VM is emulated (TCG): these are not a hardware NIC's figures. Compare ratios taken in the one run, not absolute times.\n")
	fmt.Fprintf(w, "\n| payload | conc | system | p50 µs | p99 µs | ops/s | calls | p50 ÷ rawtcp | ops/s ÷ rawtcp | p50 ÷ perftest floor |\n")
	fmt.Fprintf(w, "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range s.Rows {
		fmt.Fprintf(w, "| %s | %d | %s | %.1f | %.1f | %.0f | %d | %s | %s | %s |\n", bench.SizeName(r.PayloadBytes), r.Concurrency, r.System,
			r.P50Us, r.P99Us, r.OpsPerSec, r.Calls, ratio(r.P50VsRawTCP), ratio(r.OpsVsRawTCP), ratio(r.P50VsFloor))
	}
	fmt.Fprintf(w, "\nperftest on rxe0 in the same VM (medians across runs; ib_send_lat reports half a round trip, ib_read_lat a whole one):\n\n")
	fmt.Fprintf(w, "| tool | bytes | runs | t_typical µs | 99%% µs |\n|---|---:|---:|---:|---:|\n")
	for _, p := range s.Perftest {
		fmt.Fprintf(w, "| %s | %s | %d | %.2f | %.2f |\n", p.Tool, bench.SizeName(p.Bytes), p.Runs, p.TypicalUs, p.P99Us)
	}
	fmt.Fprintf(w, "\nThe perftest floor of one echo call (concurrency 1), from the table above:\n\n")
	for _, f := range s.Floors {
		fmt.Fprintf(w, "- %s: %.1f µs = %s\n", bench.SizeName(f.PayloadBytes), f.Us, f.How)
	}
}

func ratio(f float64) string {
	if f == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2fx", f)
}
