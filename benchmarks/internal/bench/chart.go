package bench

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Chart files, written into the output directory by WriteCharts.
const (
	ChartLatency    = "latency_p50.png"     // p50 vs payload at the lowest concurrency, log-log
	ChartOps        = "throughput_ops.png"  // ops/s vs concurrency at the smallest payload
	ChartThroughput = "throughput_mbps.png" // MB/s vs payload, log-log
)

// WriteCharts draws the charts of results into dir and returns the files written. A chart
// whose slice of the matrix has no data is left out. The run's mode is put in every
// chart's title.
func WriteCharts(dir string, mode Mode, results []Result) ([]string, error) {
	payloads, concs := axes(results)
	if len(payloads) == 0 {
		return nil, nil
	}
	var files []string
	save := func(c *chart, name string) error {
		path := filepath.Join(dir, name)
		if err := c.save(path); err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		files = append(files, path)
		return nil
	}

	// Latency against payload at the lowest concurrency.
	c0 := concs[0]
	c := newChart(fmt.Sprintf("Median latency of one echo call, concurrency %d (%s)", c0, mode),
		"payload (request and response each, log)", "p50 latency (log)")
	c.addLines(results, func(r *Result) (float64, float64, bool) {
		return float64(r.PayloadBytes), float64(r.P50Ns) / 1e3, r.Concurrency == c0
	})
	p := c.p
	logAxis(&p.X, sizeTicks(payloads))
	logAxis(&p.Y, decadeTicks(p.Y.Min, p.Y.Max, usLabel))
	if err := save(c, ChartLatency); err != nil {
		return files, err
	}

	// Throughput in calls against concurrency at the smallest payload.
	p0 := payloads[0]
	c = newChart(fmt.Sprintf("Calls per second, %s echo (%s)", SizeName(p0), mode), "concurrent callers (log)", "ops/s")
	c.addLines(results, func(r *Result) (float64, float64, bool) {
		return float64(r.Concurrency), r.OpsPerSec, r.PayloadBytes == p0
	})
	p = c.p
	ticks := make(plot.ConstantTicks, len(concs))
	for i, c := range concs {
		ticks[i] = plot.Tick{Value: float64(c), Label: fmt.Sprint(c)}
	}
	logAxis(&p.X, ticks)
	p.Y.Min = 0
	p.Y.Max *= 1.1
	p.Y.Tick.Marker = relabel{plot.DefaultTicks{}, func(v float64) string {
		if v >= 1e4 {
			return fmt.Sprintf("%gk", v/1e3)
		}
		return fmt.Sprintf("%g", v)
	}}
	if err := save(c, ChartOps); err != nil {
		return files, err
	}

	// Bytes per second against payload, at the highest concurrency that every payload has.
	cb := concs[0]
	for _, c := range concs {
		n := 0
		for _, pl := range payloads {
			if slices.ContainsFunc(results, func(r Result) bool { return r.PayloadBytes == pl && r.Concurrency == c }) {
				n++
			}
		}
		if n == len(payloads) {
			cb = c
		}
	}
	c = newChart(fmt.Sprintf("Payload throughput (request + response), concurrency %d (%s)", cb, mode),
		"payload (log)", "MB/s (10^6 bytes, log)")
	c.addLines(results, func(r *Result) (float64, float64, bool) {
		return float64(r.PayloadBytes), r.MBPerSec, r.Concurrency == cb
	})
	p = c.p
	logAxis(&p.X, sizeTicks(payloads))
	logAxis(&p.Y, decadeTicks(p.Y.Min, p.Y.Max, func(v float64) string { return fmt.Sprintf("%g", v) }))
	if err := save(c, ChartThroughput); err != nil {
		return files, err
	}
	return files, nil
}

// axes returns the payloads and concurrencies present in results, sorted.
func axes(results []Result) (payloads, concs []int) {
	for _, r := range results {
		if !slices.Contains(payloads, r.PayloadBytes) {
			payloads = append(payloads, r.PayloadBytes)
		}
		if !slices.Contains(concs, r.Concurrency) {
			concs = append(concs, r.Concurrency)
		}
	}
	slices.Sort(payloads)
	slices.Sort(concs)
	return payloads, concs
}

// chart is a plot with its legend drawn beside it, where it never hides a line.
type chart struct {
	p   *plot.Plot
	leg plot.Legend
}

const (
	chartWidth  = 8 * vg.Inch
	chartHeight = 4.5 * vg.Inch
	legendWidth = 1.4 * vg.Inch
	chartDPI    = 110
)

func newChart(title, x, y string) *chart {
	c := &chart{p: plot.New(), leg: plot.NewLegend()}
	c.p.Title.Text = title
	c.p.X.Label.Text = x
	c.p.Y.Label.Text = y
	c.p.Add(plotter.NewGrid())
	c.leg.Top, c.leg.Left = true, true
	c.leg.YOffs = -c.p.Title.TextStyle.Height(title) - vg.Points(12)
	return c
}

// save writes the chart as a PNG: the plot, and the legend in a column on its right.
func (c *chart) save(path string) error {
	img := vgimg.NewWith(vgimg.UseWH(chartWidth, chartHeight), vgimg.UseDPI(chartDPI))
	dc := draw.New(img)
	c.p.Draw(draw.Crop(dc, 0, -legendWidth, 0, 0))
	c.leg.Draw(draw.Crop(dc, chartWidth-legendWidth+vg.Points(6), 0, 0, 0))
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

// addLines adds one line per system, in Systems order so that a system keeps its colour
// and marker in every chart; pick selects a result's point.
func (c *chart) addLines(results []Result, pick func(*Result) (x, y float64, ok bool)) {
	p := c.p
	for i, s := range Systems {
		var xys plotter.XYs
		for j := range results {
			r := &results[j]
			if r.System != s.Name {
				continue
			}
			if x, y, ok := pick(r); ok && y > 0 {
				xys = append(xys, plotter.XY{X: x, Y: y})
			}
		}
		if len(xys) == 0 {
			continue
		}
		slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			continue
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		points.Radius = vg.Points(3)
		p.Add(line, points)
		c.leg.Add(s.Name, line, points)
	}
}

// logAxis puts an axis on a log scale with the given ticks, padded so that a single point
// (or points at the ends) does not sit on the frame.
func logAxis(a *plot.Axis, ticks plot.Ticker) {
	if a.Min <= 0 {
		a.Min = math.SmallestNonzeroFloat64
	}
	if a.Max <= a.Min {
		a.Max = a.Min
	}
	a.Min /= 1.5
	a.Max *= 1.5
	a.Scale = plot.LogScale{}
	a.Tick.Marker = ticks
}

// relabel rewrites the labels of another ticker's major ticks.
type relabel struct {
	plot.Ticker
	label func(float64) string
}

func (r relabel) Ticks(min, max float64) []plot.Tick {
	ts := r.Ticker.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = r.label(ts[i].Value)
		}
	}
	return ts
}

// usLabel labels a latency axis in microseconds: 5 µs, 100 µs, 2 ms, 1 s.
func usLabel(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%g s", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%g ms", us/1e3)
	}
	return fmt.Sprintf("%g µs", us)
}

// sizeTicks labels the payload sizes.
func sizeTicks(payloads []int) plot.Ticker {
	t := make(plot.ConstantTicks, len(payloads))
	for i, p := range payloads {
		t[i] = plot.Tick{Value: float64(p), Label: SizeName(p)}
	}
	return t
}

// decadeTicks labels 1, 10, 100 ... between min and max (with 2 and 5 as well when the
// range spans less than two decades), with unlabelled minor ticks in between.
func decadeTicks(min, max float64, label func(float64) string) plot.Ticker {
	if min <= 0 {
		min = max / 1000
	}
	lo, hi := math.Floor(math.Log10(min/1.5)), math.Ceil(math.Log10(max*1.5))
	labelled := []float64{1}
	if hi-lo <= 2 {
		labelled = []float64{1, 2, 5}
	}
	var t plot.ConstantTicks
	for e := lo; e <= hi; e++ {
		dec := math.Pow(10, e)
		for m := 1.0; m < 10; m++ {
			tick := plot.Tick{Value: m * dec}
			if slices.Contains(labelled, m) {
				tick.Label = label(m * dec)
			}
			t = append(t, tick)
		}
	}
	return t
}
