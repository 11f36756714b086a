package bench

import (
	"fmt"
	"time"
)

// Goal is one of the goals mwrpc is held to: a figure of one mwrpc system against a
// peer's, or a floor's, in the same run (Got, a ratio), at least or at most Want. A
// latency goal with no peer (Unit "µs") compares a p50 with a fixed figure. Goals reads
// the two-process goals, Targets the in-process ones, StreamTargets the streaming cell's.
type Goal struct {
	Area   string // what the goal is about: "soft TCP, one Client", "shm" (none in Targets and StreamTargets)
	What   string // the figure, e.g. "calls/s, mwrpc-tcp ÷ max(drpc, kitex)"
	Where  string // the cell or the stream's direction: "64 B c16", DirServerStream
	Want   float64
	AtMost bool   // Got must be at most Want (a latency); else at least
	Unit   string // "x" for a ratio, "µs" for a latency in microseconds
	Got    float64
}

// Met reports whether the goal is met.
func (g Goal) Met() bool {
	if g.AtMost {
		return g.Got <= g.Want
	}
	return g.Got >= g.Want
}

// loneCallerP50 is the one-caller 64 B p50 over soft TCP that mwrpc is to be no worse
// than: its own in its first two-process run on the 16-core machine, one connection a
// Client, before lanes.
const loneCallerP50 = 35 * time.Microsecond

// Goals evaluates the two-process goals on the systems and cells the report has: one
// Client over soft TCP (mwrpc-tcp) against the better of DRPC and Kitex and against raw
// TCP with a connection per caller; the shm fabric (mwrpc-shm and mwrpc-shm-lent)
// against shmipc-go and raw TCP, per call and per stream. The goals are set for a 16-core
// machine with the server on cores 0-7 and the client on 8-15, and the shm ones for a
// 2-core one too; a goal whose systems or cell the report lacks is left out.
func (r *Report) Goals() []Goal {
	var gs []Goal
	add := func(g Goal, got figure) {
		if got.ok {
			g.Got = got.v
			gs = append(gs, g)
		}
	}
	for _, c := range []struct {
		cell         Cell
		peers, floor float64
	}{
		{Cell{64, 16}, 1.5, 0.6}, {Cell{64, 64}, 1.5, 0.6}, {Cell{4 << 10, 64}, 1.5, 0.6},
		{Cell{64 << 10, 16}, 2, 0.5}, {Cell{1 << 20, 16}, 2, 0.5},
	} {
		tcp := Goal{Area: "soft TCP, one Client", Where: c.cell.String(), Unit: "x"}
		tcp.What, tcp.Want = "calls/s, mwrpc-tcp ÷ max(drpc, kitex)", c.peers
		add(tcp, r.opsOverBest("mwrpc-tcp", c.cell, "drpc", "kitex"))
		tcp.What, tcp.Want = "calls/s, mwrpc-tcp ÷ rawtcp", c.floor
		add(tcp, r.opsOver("mwrpc-tcp", "rawtcp", c.cell))
	}
	if s := r.find("mwrpc-tcp", Cell{64, 1}); s != nil {
		add(Goal{Area: "soft TCP, one Client", What: "p50, mwrpc-tcp", Where: "64 B c1",
			Want: float64(loneCallerP50) / 1e3, AtMost: true, Unit: "µs"}, figure{float64(s.P50Ns) / 1e3, true})
	}
	shm := func(what, where string, want float64, atMost bool, got figure) {
		add(Goal{Area: "shm", What: what, Where: where, Want: want, AtMost: atMost, Unit: "x"}, got)
	}
	shm("p50, mwrpc-shm ÷ shmipc", "64 B c1", 0.5, true, r.p50Over("mwrpc-shm", "shmipc", Cell{64, 1}))
	for _, c := range []Cell{{64, 16}, {64, 64}} {
		shm("calls/s, mwrpc-shm ÷ shmipc", c.String(), 1.5, false, r.opsOver("mwrpc-shm", "shmipc", c))
	}
	for _, sys := range []string{"mwrpc-shm", "mwrpc-shm-lent"} {
		big := Cell{1 << 20, 1}
		shm("p50, "+sys+" ÷ rawtcp", big.String(), 0.3, true, r.p50Over(sys, "rawtcp", big))
		shm("p50, "+sys+" ÷ shmipc", big.String(), 0.5, true, r.p50Over(sys, "shmipc", big))
		for _, dir := range []string{DirServerStream, DirClientStream} {
			shm("MB/s, "+sys+" ÷ rawtcp", dir, 2, false, r.streamOver(sys, "rawtcp", dir))
		}
	}
	return gs
}

// figure is a goal's figure, and whether the report had what it needs (ok).
type figure struct {
	v  float64
	ok bool
}

// over is a over b, a figure when b is above zero.
func over(a, b float64) figure {
	if b <= 0 {
		return figure{}
	}
	return figure{a / b, true}
}

// opsOver is sys's calls/s over base's in cell c.
func (r *Report) opsOver(sys, base string, c Cell) figure {
	s, b := r.find(sys, c), r.find(base, c)
	if s == nil || b == nil {
		return figure{}
	}
	return over(s.OpsPerSec, b.OpsPerSec)
}

// opsOverBest is sys's calls/s over the best of peers' in cell c (those measured).
func (r *Report) opsOverBest(sys string, c Cell, peers ...string) figure {
	best := 0.0
	for _, p := range peers {
		if b := r.find(p, c); b != nil {
			best = max(best, b.OpsPerSec)
		}
	}
	s := r.find(sys, c)
	if s == nil {
		return figure{}
	}
	return over(s.OpsPerSec, best)
}

// p50Over is sys's p50 over base's in cell c.
func (r *Report) p50Over(sys, base string, c Cell) figure {
	s, b := r.find(sys, c), r.find(base, c)
	if s == nil || b == nil {
		return figure{}
	}
	return over(float64(s.P50Ns), float64(b.P50Ns))
}

// streamOver is sys's stream throughput over base's in direction dir.
func (r *Report) streamOver(sys, base, dir string) figure {
	s, b := r.findStream(sys, dir), r.findStream(base, dir)
	if s == nil || b == nil {
		return figure{}
	}
	return over(s.MBPerSec, b.MBPerSec)
}

// writeGoals writes the goals section of a two-process report that has any of the goals'
// systems: a row a goal, with its verdict.
func (r *Report) writeGoals(ew *errWriter) {
	if r.Setup.Mode != ModeTwoProcess {
		return
	}
	gs := r.Goals()
	if len(gs) == 0 {
		return
	}
	m := r.Machine
	ew.printf("\n## Goals\n\n")
	ew.printf("The goals for two processes, evaluated on this run (%d CPUs, GOMAXPROCS %d): they are set for a 16-core machine with the server on cores 0-7 and the client on 8-15 (`-cpus`), the shm ones for a 2-core machine too. A ratio is mwrpc's figure over the peer's in the same run; \"max(drpc, kitex)\" is the better of the two in the cell.\n\n", m.NumCPU, m.GOMAXPROCS)
	ew.printf("| area | figure | where | got | goal | verdict |\n")
	ew.printf("|---|---|---|---:|---:|---|\n")
	for _, g := range gs {
		verdict := "**missed**"
		if g.Met() {
			verdict = "met"
		}
		bound := "at least"
		if g.AtMost {
			bound = "at most"
		}
		ew.printf("| %s | %s | %s | %s | %s %s | %s |\n", g.Area, g.What, g.Where, g.format(g.Got), bound, g.format(g.Want), verdict)
	}
}

// format writes v in g's unit.
func (g Goal) format(v float64) string {
	if g.Unit == "µs" {
		return fmt.Sprintf("%.1f µs", v)
	}
	return fmt.Sprintf("%.2fx", v)
}
