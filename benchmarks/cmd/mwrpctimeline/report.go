package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/mwrpc/mwrpc/internal/probe"
)

// report analyses every phase and writes timeline.md (printed too), timeline.json and
// timeline.png into dir.
func report(runs []*phase, dir, args string) error {
	var md strings.Builder
	fmt.Fprintf(&md, "# Timeline of one call, two processes, soft TCP fabric on loopback\n\n")
	host, _ := os.Hostname()
	fmt.Fprintf(&md, "%s, %s, GOMAXPROCS %d, %d CPUs, %s; `mwrpctimeline %s`\n\n", time.Now().UTC().Format(time.RFC3339),
		runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), host, args)
	for _, ph := range runs {
		fmt.Fprintf(&md, "## %s, %s, concurrency 1\n\n", ph.System, sizeName(ph.Size))
		fmt.Fprintf(&md, "p50 %.1f µs, p90 %.1f µs over %d calls (time.Now around each call).\n\n", ph.P50us,
			float64(percentile(ph.lat, 0.9))/1e3, len(ph.lat))
		if !probe.Enabled {
			continue
		}
		a := analyse(ph)
		ph.an = a
		fmt.Fprintf(&md, "Rows: the most common sequence of steps among the calls between p40 and p60, and the median of each step "+
			"over the %d of those calls that followed it (their p50 %.1f µs; the row medians add up to %.1f µs, the row means to %.1f µs). "+
			"%d of all %d calls followed that sequence (their p50 %.1f µs; %d sequences in all). Marks lost: %d.\n\n",
			a.Band, a.MatchedP50, a.SumOfMedian, a.SumOfMean, a.Matched, a.Calls, a.AllP50, a.Variants, a.LostMarks)
		md.WriteString("| # | side | step | Δ median µs | Δ mean µs | at µs | what the Δ is |\n|---:|---|---|---:|---:|---:|---|\n")
		for i, r := range a.Rows {
			fmt.Fprintf(&md, "| %d | %s | %s | %.2f | %.2f | %.1f | %s |\n", i, r.Side, r.Step, r.DeltaUs, r.MeanUs, r.AtUs, r.Category)
		}
		md.WriteString("\nBy category (sum of the row means): ")
		var parts []string
		for _, c := range categories {
			if v := a.ByCategory[c]; v > 0 {
				parts = append(parts, fmt.Sprintf("%s %.1f µs", c, v))
			}
		}
		md.WriteString(strings.Join(parts, "; ") + ".\n\n")
		var sys []string
		for k, v := range a.Syscalls {
			sys = append(sys, fmt.Sprintf("%s %.2f", k, v))
		}
		slices.Sort(sys)
		fmt.Fprintf(&md, "Socket syscalls per call (marked; Go's read(2) that finds nothing and parks counts once): %s.\n\n", strings.Join(sys, ", "))
		if len(a.After) > 0 {
			md.WriteString("After the caller has its response (off the measured path, overlapping the next call):\n\n")
			for _, s := range a.After {
				fmt.Fprintf(&md, "- %s\n", s)
			}
			md.WriteString("\n")
		}
	}
	fmt.Print(md.String())
	if err := os.WriteFile(filepath.Join(dir, "timeline.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	type jp struct {
		System string    `json:"system"`
		Bytes  int       `json:"payload_bytes"`
		P50us  float64   `json:"p50_us"`
		Steps  *analysis `json:"steps,omitempty"`
	}
	var js []jp
	for _, ph := range runs {
		js = append(js, jp{ph.System, ph.Size, ph.P50us, ph.an})
	}
	b, err := json.MarshalIndent(js, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "timeline.json"), b, 0o644); err != nil {
		return err
	}
	if !probe.Enabled {
		return nil
	}
	return chart(runs, filepath.Join(dir, "timeline.png"))
}

// chart draws one stacked horizontal bar per phase: the median call's time by category.
func chart(runs []*phase, path string) error {
	p := plot.New()
	p.Title.Text = "Where the median call's time goes, concurrency 1, two processes, soft TCP on loopback"
	p.X.Label.Text = "µs"
	p.Add(plotter.NewGrid())
	var names []string
	for i := len(runs) - 1; i >= 0; i-- { // the first phase on top
		names = append(names, fmt.Sprintf("%s %s", runs[i].System, sizeName(runs[i].Size)))
	}
	colors := []color.Color{
		color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
		color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x8c, 0x8c, 0xff},
	}
	leg := plot.NewLegend()
	var prev *plotter.BarChart
	for ci, c := range categories {
		vals := make(plotter.Values, len(runs))
		for i := range runs {
			if a := runs[len(runs)-1-i].an; a != nil {
				vals[i] = a.ByCategory[c]
			}
		}
		bc, err := plotter.NewBarChart(vals, vg.Points(22))
		if err != nil {
			return err
		}
		bc.Horizontal = true
		bc.Color = colors[ci]
		bc.LineStyle.Width = 0
		if prev != nil {
			bc.StackOn(prev)
		}
		p.Add(bc)
		leg.Add(c, bc)
		prev = bc
	}
	p.NominalY(names...)
	const w, h = 9 * vg.Inch, 4 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
	dc := draw.New(img)
	legW := 2.2 * vg.Inch
	p.Draw(draw.Crop(dc, 0, -legW, 0, 0))
	leg.Top, leg.Left = true, true
	leg.YOffs = -vg.Points(30)
	leg.Draw(draw.Crop(dc, w-legW+vg.Points(6), 0, 0, 0))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
