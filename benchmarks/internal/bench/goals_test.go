package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// goalsReport is a two-process report with the cells and systems the goals read.
func goalsReport() *Report {
	r := &Report{Setup: Setup{Mode: ModeTwoProcess}}
	echo := func(sys string, c Cell, ops float64, p50 int64) {
		r.Results = append(r.Results, Result{System: sys, PayloadBytes: c.Payload, Concurrency: c.Concurrency, OpsPerSec: ops, P50Ns: p50})
	}
	echo("mwrpc-tcp", Cell{64, 16}, 300e3, 0)
	echo("drpc", Cell{64, 16}, 250e3, 0) // the better peer: 300/250 = 1.2x, missed
	echo("kitex", Cell{64, 16}, 150e3, 0)
	echo("rawtcp", Cell{64, 16}, 400e3, 0)
	echo("mwrpc-tcp", Cell{64 << 10, 16}, 100e3, 0)
	echo("drpc", Cell{64 << 10, 16}, 40e3, 0) // no Kitex in this cell: 100/40 = 2.5x, met
	echo("mwrpc-tcp", Cell{64, 1}, 0, 31_600)
	echo("mwrpc-shm", Cell{64, 1}, 0, 6_000)
	echo("shmipc", Cell{64, 1}, 0, 30_000)
	echo("mwrpc-shm", Cell{64, 64}, 700e3, 0)
	echo("shmipc", Cell{64, 64}, 880e3, 0)
	echo("mwrpc-shm-lent", Cell{1 << 20, 1}, 0, 150_000)
	echo("rawtcp", Cell{1 << 20, 1}, 0, 500_000)
	stream := func(sys, dir string, mbps float64) {
		r.StreamResults = append(r.StreamResults, StreamResult{System: sys, Direction: dir, MBPerSec: mbps})
	}
	stream("mwrpc-shm", DirServerStream, 9000)
	stream("rawtcp", DirServerStream, 5000)
	return r
}

func TestGoals(t *testing.T) {
	got := map[string]Goal{}
	for _, g := range goalsReport().Goals() {
		got[g.What+" @ "+g.Where] = g
	}
	for _, tc := range []struct {
		key  string
		want float64
		met  bool
	}{
		{"calls/s, mwrpc-tcp ÷ max(drpc, kitex) @ 64 B c16", 1.2, false},
		{"calls/s, mwrpc-tcp ÷ rawtcp @ 64 B c16", 0.75, true},
		{"calls/s, mwrpc-tcp ÷ max(drpc, kitex) @ 64 KiB c16", 2.5, true},
		{"p50, mwrpc-tcp @ 64 B c1", 31.6, true},
		{"p50, mwrpc-shm ÷ shmipc @ 64 B c1", 0.2, true},
		{"calls/s, mwrpc-shm ÷ shmipc @ 64 B c64", 700.0 / 880, false},
		{"p50, mwrpc-shm-lent ÷ rawtcp @ 1 MiB c1", 0.3, true}, // at most 0.3x: met at exactly it
		{"MB/s, mwrpc-shm ÷ rawtcp @ server-stream", 1.8, false},
	} {
		g, ok := got[tc.key]
		if !ok {
			t.Errorf("no goal %q; have %v", tc.key, keys(got))
			continue
		}
		if math.Abs(g.Got-tc.want) > 1e-9 || g.Met() != tc.met {
			t.Errorf("%s: got %.4f (met %v), want %.4f (met %v)", tc.key, g.Got, g.Met(), tc.want, tc.met)
		}
	}
	// A goal whose systems or cell the run lacks is left out, not counted as missed.
	for _, absent := range []string{
		"calls/s, mwrpc-tcp ÷ rawtcp @ 64 KiB c16",          // no raw TCP in that cell
		"calls/s, mwrpc-tcp ÷ max(drpc, kitex) @ 1 MiB c16", // no such cell
		"p50, mwrpc-shm-lent ÷ shmipc @ 1 MiB c1",           // no shmipc-go at 1 MiB
		"MB/s, mwrpc-shm ÷ rawtcp @ client-stream",          // no client stream
	} {
		if _, ok := got[absent]; ok {
			t.Errorf("goal %q evaluated without its figures", absent)
		}
	}
}

func TestGoalsInMarkdown(t *testing.T) {
	r := goalsReport()
	var md bytes.Buffer
	if err := r.writeMarkdownGoals(&md); err != nil {
		t.Fatal(err)
	}
	out := md.String()
	for _, want := range []string{
		"## Goals",
		"| soft TCP, one Client | calls/s, mwrpc-tcp ÷ max(drpc, kitex) | 64 B c16 | 1.20x | at least 1.50x | **missed** |",
		"| soft TCP, one Client | p50, mwrpc-tcp | 64 B c1 | 31.6 µs | at most 35.0 µs | met |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("goals section lacks %q:\n%s", want, out)
		}
	}
	r.Setup.Mode = ModeInProcess // the goals are for two processes
	md.Reset()
	if err := r.writeMarkdownGoals(&md); err != nil {
		t.Fatal(err)
	}
	if md.Len() != 0 {
		t.Errorf("an in-process report has a goals section:\n%s", md.String())
	}
}

// writeMarkdownGoals writes only r's goals section.
func (r *Report) writeMarkdownGoals(w *bytes.Buffer) error {
	ew := &errWriter{w: w}
	r.writeGoals(ew)
	return ew.err
}

func keys(m map[string]Goal) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
