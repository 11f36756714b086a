package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Progress hears about the run as it goes.
type Progress interface {
	Start(total int)                                  // measurements to come
	Warmup(cell Cell, system string)                  // a warm-up begins
	Begin(cell Cell, round int, system string)        // a measurement begins
	End(cell Cell, round int, system string, r Round) // and ends
	Finish()                                          // the run is over

	// StreamBegin: a transfer of the streaming cell begins in direction dir (round < 0:
	// the system's warm-up, dir "warm-up").
	StreamBegin(system, dir string, round int)
	// StreamEnd: and ends.
	StreamEnd(system, dir string, round int, r StreamRound)
}

type nopProgress struct{}

func (nopProgress) Start(int)                    {}
func (nopProgress) Warmup(Cell, string)          {}
func (nopProgress) Begin(Cell, int, string)      {}
func (nopProgress) End(Cell, int, string, Round) {}
func (nopProgress) Finish()                      {}

func (nopProgress) StreamBegin(string, string, int)            {}
func (nopProgress) StreamEnd(string, string, int, StreamRound) {}

// NewProgress reports to w: a bar redrawn in place when w is a terminal, otherwise one
// line per measurement (for logs and CI).
func NewProgress(w io.Writer, terminal bool, rounds int) Progress {
	return &progress{w: w, tty: terminal, rounds: rounds}
}

type progress struct {
	w      io.Writer
	tty    bool
	rounds int
	total  int
	done   int
	start  time.Time
}

func (p *progress) Start(total int) { p.total, p.done, p.start = total, 0, time.Now() }

func (p *progress) Warmup(cell Cell, system string) {
	if p.tty {
		p.bar(fmt.Sprintf("%v warm-up %s", cell, system))
	}
}

func (p *progress) Begin(cell Cell, round int, system string) {
	if p.tty {
		p.bar(fmt.Sprintf("%v round %d/%d %s", cell, round+1, p.rounds, system))
	}
}

func (p *progress) End(cell Cell, round int, system string, r Round) {
	p.done++
	if p.tty {
		return
	}
	fmt.Fprintf(p.w, "[%*d/%d] %-12s c%-3d round %d/%d  %-13s p50 %-9s %10.0f ops/s  %6.1f allocs/op\n",
		len(fmt.Sprint(p.total)), p.done, p.total, SizeName(cell.Payload), cell.Concurrency,
		round+1, p.rounds, system, DurName(r.P50.Nanoseconds()), r.OpsPerSec(), float64(r.Mallocs)/float64(r.Ops))
}

func (p *progress) StreamBegin(system, dir string, round int) {
	if !p.tty {
		return
	}
	if round < 0 {
		p.bar(fmt.Sprintf("stream warm-up %s", system))
		return
	}
	p.bar(fmt.Sprintf("stream round %d/%d %s %s", round+1, p.rounds, system, dir))
}

func (p *progress) StreamEnd(system, dir string, round int, r StreamRound) {
	p.done++
	if p.tty {
		return
	}
	fmt.Fprintf(p.w, "[%*d/%d] stream %-8s round %d/%d  %-15s %-13s %8.0f MB/s  CPU %.2f s",
		len(fmt.Sprint(p.total)), p.done, p.total, SizeName64(r.Bytes), round+1, p.rounds,
		system, dir, r.MBPerSec(), r.CPU.Seconds())
	if r.HasServerCPU {
		fmt.Fprintf(p.w, ", server %.2f s", r.ServerCPU.Seconds())
	}
	fmt.Fprintln(p.w)
}

// bar redraws the progress line: bar, count, elapsed and estimated time left, and what
// is running now.
func (p *progress) bar(what string) {
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = width * p.done / p.total
	}
	elapsed := time.Since(p.start).Round(time.Second)
	eta := "?"
	if p.done > 0 {
		left := time.Duration(float64(time.Since(p.start)) / float64(p.done) * float64(p.total-p.done))
		eta = left.Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "\r\x1b[K[%s%s] %d/%d  %v elapsed, ~%s left  %s",
		strings.Repeat("#", filled), strings.Repeat("-", width-filled), p.done, p.total, elapsed, eta, what)
}

func (p *progress) Finish() {
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%d measurements in %v\n", p.done, time.Since(p.start).Round(100*time.Millisecond))
	}
}
