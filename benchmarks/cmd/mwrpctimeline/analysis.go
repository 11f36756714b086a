package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// event is a mark of either process on the common clock.
type event struct {
	t    int64
	side byte // 'C' client, 'S' server
	step probe.Step
	aux  uint32
	n    int // reads merged into this one (a payload that took several read(2)s)
	drop bool
}

// key is what a step's place in the sequence is judged by: side, step and, for the steps
// that say which message or frame, that.
func (e *event) key() string {
	switch e.step {
	case probe.Frame, probe.Delivered, probe.Recv, probe.Post, probe.PostSend, probe.PollerWake:
		return fmt.Sprintf("%c%d.%d", e.side, e.step, e.aux)
	}
	return fmt.Sprintf("%c%d", e.side, e.step)
}

var frameOps = []string{"?", "SEND", "SEND_IMM", "SEND_INV", "WRITE", "WRITE_IMM", "READ_REQ", "READ_RESP", "ACK", "NAK", "BATCH"}
var msgKinds = []string{"?", "request", "response", "cancel", "release", "ping", "pong", "goaway", "stream msg", "stream ack"}

func name(s []string, i uint32) string {
	if int(i) < len(s) {
		return s[i]
	}
	return fmt.Sprint(i)
}

// label is a row's text.
func (e *event) label() string {
	s := e.step.String()
	switch e.step {
	case probe.Frame, probe.Delivered:
		s += " (" + name(frameOps, e.aux) + ")"
	case probe.Recv:
		s += " (" + name(msgKinds, e.aux&0xff)
		if e.aux&0x100 != 0 {
			s += ", large: a window"
		}
		s += ")"
	case probe.Post:
		s += " (" + name(msgKinds, e.aux&0xff)
		if e.aux&0x100 != 0 {
			s += ", SEND_WITH_INV"
		}
		s += ")"
	case probe.PostSend:
		s += " (" + verbs.WROpcode(e.aux).String() + ")"
	case probe.PollerWake:
		s += " (" + name([]string{"?", "completion", "kick", "timer"}, e.aux) + ")"
	case probe.Write, probe.Writev:
		s += fmt.Sprintf(" %d B", e.aux)
	case probe.ReadDone, probe.ReadPayDone:
		if e.n > 1 {
			s += fmt.Sprintf(" (%d B in %d reads)", e.aux, e.n)
		} else {
			s += fmt.Sprintf(" (%d B)", e.aux)
		}
	}
	return s
}

// Categories of the time between two consecutive events: where the wall time goes.
const (
	catWrite   = "write/writev syscall"
	catWake    = "delivery + wake-up + read"
	catRead    = "read syscall"
	catHandoff = "goroutine hand-off"
	catCopy    = "copy in user space"
	catWork    = "other user-space work"
)

var categories = []string{catWrite, catWake, catRead, catHandoff, catCopy, catWork}

// category is where the time from prev to e went.
func category(prev, e *event) string {
	switch e.step {
	case probe.WriteDone, probe.WritevDone:
		return catWrite
	case probe.ReadDone, probe.ReadPayDone:
		if prev.side != e.side {
			return catWake // the reader was blocked until the other process wrote
		}
		return catRead
	case probe.EngWake, probe.Handler, probe.Woken, probe.PollerWake:
		return catHandoff
	case probe.CopyInDone, probe.CopyRespDone, probe.CloneDone:
		return catCopy
	}
	return catWork
}

// row is one step of the timeline: its median duration from the step before.
type row struct {
	Side     string  `json:"side"`
	Step     string  `json:"step"`
	DeltaUs  float64 `json:"median_delta_us"`
	MeanUs   float64 `json:"mean_delta_us"`
	AtUs     float64 `json:"median_at_us"`
	Category string  `json:"category"`
}

type analysis struct {
	Calls       int                `json:"calls"`
	Matched     int                `json:"calls_in_sequence"`
	Variants    int                `json:"sequences"`
	Band        int                `json:"calls_p40_p60_in_sequence"`
	P50us       float64            `json:"p50_us"`
	MatchedP50  float64            `json:"p50_in_band_us"`
	AllP50      float64            `json:"p50_in_sequence_us"`
	Rows        []row              `json:"rows"`
	ByCategory  map[string]float64 `json:"by_category_us"`
	Syscalls    map[string]float64 `json:"syscalls_per_call"`
	After       []string           `json:"after_the_call"`
	LostMarks   uint64             `json:"lost_marks"`
	SumOfMedian float64            `json:"sum_of_row_medians_us"`
	SumOfMean   float64            `json:"sum_of_row_means_us"`
}

// analyse joins the two processes' marks, splits them into calls at the client's
// CallBegin marks, finds the most common sequence of steps and takes, over the calls that
// followed it, the median of each step's time from the one before.
func analyse(ph *phase) *analysis {
	evs := joinMarks(ph)
	begins := callBegins(evs)
	a := &analysis{ByCategory: map[string]float64{}, Syscalls: map[string]float64{}, LostMarks: ph.lost}
	seqs, t := splitCalls(evs, begins)
	a.Calls = len(seqs)
	a.P50us = float64(percentile(ph.lat, 0.5)) / 1e3
	t.report(a, len(begins))
	matched := typicalCalls(a, seqs)
	if len(matched) == 0 {
		return a
	}
	stepRows(a, matched)
	return a
}

// callSeq is one call's marks, from its CallBegin to its CallEnd, with the signature its
// sequence of steps is compared by.
type callSeq struct {
	evs []event
	sig string
	lat time.Duration
}

// joinMarks puts both processes' marks on one timeline, in time order.
func joinMarks(ph *phase) []event {
	evs := make([]event, 0, len(ph.client)+len(ph.server))
	for _, r := range ph.client {
		evs = append(evs, event{t: r.T, side: 'C', step: r.Step, aux: r.Aux, n: 1})
	}
	for _, r := range ph.server {
		evs = append(evs, event{t: r.T, side: 'S', step: r.Step, aux: r.Aux, n: 1})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].t < evs[j].t })
	return evs
}

// callBegins is where each call starts: the indexes of the client's CallBegin marks.
func callBegins(evs []event) []int {
	var begins []int
	for i := range evs {
		if evs[i].side == 'C' && evs[i].step == probe.CallBegin {
			begins = append(begins, i)
		}
	}
	return begins
}

// tally counts, over all calls, the syscalls in each call's stretch of the timeline and
// the steps that came after a call had already ended.
type tally struct {
	sys        map[string]int
	after      map[string]int
	afterLabel map[string]string
}

// splitCalls cuts the timeline at each call's beginning and keeps the calls that ended
// before the next began.
func splitCalls(evs []event, begins []int) ([]callSeq, *tally) {
	t := &tally{sys: map[string]int{}, after: map[string]int{}, afterLabel: map[string]string{}}
	var seqs []callSeq
	for k, b := range begins {
		end := len(evs)
		if k+1 < len(begins) {
			end = begins[k+1]
		}
		win := evs[b:end]
		t.countSyscalls(win)
		ce := slices.IndexFunc(win, func(e event) bool { return e.side == 'C' && e.step == probe.CallEnd })
		if ce < 0 {
			continue
		}
		t.countAfter(win[ce+1:])
		seqs = append(seqs, newCallSeq(mergeReads(append([]event(nil), win[:ce+1]...))))
	}
	return seqs, t
}

func (t *tally) countSyscalls(win []event) {
	for i := range win {
		switch e := &win[i]; e.step {
		case probe.Write, probe.Writev:
			t.sys[string(e.side)+" write/writev"]++
		case probe.Read, probe.ReadPay:
			t.sys[string(e.side)+" read"]++
		}
	}
}

func (t *tally) countAfter(rest []event) {
	for i := range rest {
		e := &rest[i]
		t.after[e.key()]++
		t.afterLabel[e.key()] = fmt.Sprintf("%c: %s", e.side, e.label())
	}
}

// report writes the counts per call into a: syscalls per begun call, and the steps after
// the call that at least one call in twenty had.
func (t *tally) report(a *analysis, begun int) {
	for k, v := range t.sys {
		a.Syscalls[k] = float64(v) / float64(max(1, begun))
	}
	for k, v := range t.after {
		if f := float64(v) / float64(max(1, a.Calls)); f >= 0.05 {
			a.After = append(a.After, fmt.Sprintf("%s: %.2f per call", t.afterLabel[k], f))
		}
	}
	sort.Strings(a.After)
}

func newCallSeq(in []event) callSeq {
	var sb strings.Builder
	for i := range in {
		sb.WriteString(in[i].key())
		sb.WriteByte(' ')
	}
	return callSeq{in, sb.String(), time.Duration(in[len(in)-1].t - in[0].t)}
}

// typicalCalls picks the sequence of steps and returns the calls that followed it with a
// latency around the median (p40-p60). The sequence is the most common one in that band:
// the most common overall may be that of a slower mode (the floor is bimodal on a VM:
// docs/performance.md).
func typicalCalls(a *analysis, seqs []callSeq) []callSeq {
	lats := make([]time.Duration, len(seqs))
	for i, s := range seqs {
		lats[i] = s.lat
	}
	lo, hi := percentile(lats, 0.4), percentile(lats, 0.6)
	count, all := map[string]int{}, map[string]bool{}
	for _, s := range seqs {
		all[s.sig] = true
		if s.lat >= lo && s.lat <= hi {
			count[s.sig]++
		}
	}
	a.Variants = len(all)
	best := ""
	for s, n := range count {
		if n > count[best] || n == count[best] && s < best {
			best = s
		}
	}
	var matched []callSeq
	var inSeq []time.Duration
	for _, s := range seqs {
		if s.sig == best {
			inSeq = append(inSeq, s.lat)
			if s.lat >= lo && s.lat <= hi {
				matched = append(matched, s)
			}
		}
	}
	a.Matched, a.Band = len(inSeq), len(matched)
	a.AllP50 = float64(percentile(inSeq, 0.5)) / 1e3
	return matched
}

// stepRows writes the rows: the medians over the matched calls, step by step (so the rows
// add up to about the p50 of the band).
func stepRows(a *analysis, matched []callSeq) {
	n := len(matched[0].evs)
	deltas := make([][]time.Duration, n)
	ats := make([][]time.Duration, n)
	var totals []time.Duration
	for _, m := range matched {
		t0 := m.evs[0].t
		for i := range m.evs {
			if i > 0 {
				deltas[i] = append(deltas[i], time.Duration(m.evs[i].t-m.evs[i-1].t))
			}
			ats[i] = append(ats[i], time.Duration(m.evs[i].t-t0))
		}
		totals = append(totals, time.Duration(m.evs[n-1].t-t0))
	}
	a.MatchedP50 = float64(percentile(totals, 0.5)) / 1e3
	ref := matched[len(matched)/2].evs // labels (byte counts) of a typical call
	for i := range ref {
		r := row{Side: sideName(ref[i].side), Step: ref[i].label(), AtUs: float64(percentile(ats[i], 0.5)) / 1e3}
		if i > 0 {
			r.DeltaUs = float64(percentile(deltas[i], 0.5)) / 1e3
			r.MeanUs = float64(mean(deltas[i])) / 1e3
			r.Category = category(&ref[i-1], &ref[i])
			a.ByCategory[r.Category] += r.MeanUs
			a.SumOfMedian += r.DeltaUs
			a.SumOfMean += r.MeanUs
		}
		a.Rows = append(a.Rows, r)
	}
}

func sideName(s byte) string {
	if s == 'C' {
		return "client"
	}
	return "server"
}

// mergeReads folds a side's read(2)s that follow each other into one (a payload, or the
// raw echo's message, taken in several reads): the first's start, the last's return, the
// bytes added up. Whatever the other side marked in between stays.
func mergeReads(evs []event) []event {
	lastDone := map[byte]int{} // index of the side's last kept event if it is a ReadDone/ReadPayDone
	pending := map[byte]int{}
	for i := range evs {
		e := &evs[i]
		switch e.step {
		case probe.Read, probe.ReadPay:
			if j, ok := lastDone[e.side]; ok && evs[j].step == e.step+1 {
				e.drop = true
				pending[e.side] = j
				continue
			}
		case probe.ReadDone, probe.ReadPayDone:
			if j, ok := pending[e.side]; ok && evs[j].step == e.step {
				e.aux += evs[j].aux
				e.n += evs[j].n
				evs[j].drop = true
				delete(pending, e.side)
			}
			lastDone[e.side] = i
			continue
		}
		delete(lastDone, e.side)
		delete(pending, e.side)
	}
	return slices.DeleteFunc(evs, func(e event) bool { return e.drop })
}

func mean(d []time.Duration) time.Duration {
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return s / time.Duration(max(1, len(d)))
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
