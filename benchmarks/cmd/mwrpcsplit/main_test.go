package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// stack builds a sample's locations, leaf first, from frames: each frame is one location,
// its functions innermost first separated by "|" (inlined calls).
func stack(frames ...string) []*profile.Location {
	var locs []*profile.Location
	for _, f := range frames {
		loc := &profile.Location{ID: uint64(len(locs) + 1)}
		for _, name := range strings.Split(f, "|") {
			loc.Line = append(loc.Line, profile.Line{Function: &profile.Function{Name: name}})
		}
		locs = append(locs, loc)
	}
	return locs
}

func TestChargedTo(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stack []*profile.Location
		want  string
	}{
		{"leaf in mwrpc", stack(module+"transport.(*Conn).call", module+"rpc.(*Client).Invoke"), "transport"},
		{"runtime counts for its mwrpc caller", stack("runtime.memmove", "sync.(*Mutex).Lock", module+"transport/verbs/soft.(*QP).post"), "transport/verbs/soft"},
		{"helpers count for their caller", stack(module+"internal/idle.Poll", module+"transport/verbs/shm.(*Conn).poll"), "transport/verbs/shm"},
		{"inlined: the innermost line first", stack("runtime.nanotime|"+module+"internal/clock.Nanos|"+module+"rpc.(*Server).handle", module+"transport.(*Conn).dispatch"), "rpc"},
		{"a generic name with paths in brackets", stack(module + "transport.(*table[go.shape.struct { id uint64; " + module + "transport.c *int }]).get"), "transport"},
		{"the benchmarks module's packages", stack(module+"benchmarks/internal/bench.(*runner).measure.func1", "runtime.goexit"), "benchmarks/internal/bench"},
		{"no mwrpc frame", stack("runtime.gcBgMarkWorker", "runtime.goexit"), noFrame},
		{"only helpers", stack(module+"internal/idle.Poll", "runtime.goexit"), noFrame},
		{"a location without a function", []*profile.Location{{ID: 1, Line: []profile.Line{{}}}}, noFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := chargedTo(tc.stack); got != tc.want {
				t.Errorf("chargedTo's package = %q, want %q", got, tc.want)
			}
		})
	}
}

// cpuProfile returns a CPU profile whose samples are stacks with the given nanoseconds.
func cpuProfile(samples map[string]int64) *profile.Profile {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
	}
	var fid, lid uint64
	for leaf, ns := range samples {
		fid++
		lid++
		fn := &profile.Function{ID: fid, Name: leaf}
		loc := &profile.Location{ID: lid, Line: []profile.Line{{Function: fn}}}
		p.Function = append(p.Function, fn)
		p.Location = append(p.Location, loc)
		p.Sample = append(p.Sample, &profile.Sample{Location: []*profile.Location{loc}, Value: []int64{ns / 10_000_000, ns}})
	}
	return p
}

func TestSplit(t *testing.T) {
	samples := map[string]int64{
		module + "transport.(*Conn).call":               30e6,
		module + "transport.(*Conn).onRecv":             40e6,
		module + "transport/verbs/soft.(*QP).post":      50e6,
		module + "rpc.(*Client).Invoke":                 20e6,
		"runtime.gcBgMarkWorker":                        10e6,
		module + "transport/verbs/shm.(*ring).readable": 20e6,
	}
	for _, tc := range []struct {
		name   string
		byFunc bool
		want   []share // most time first, ties by name
	}{
		{"by package: summed", false, []share{
			{"transport", 70 * time.Millisecond},
			{"transport/verbs/soft", 50 * time.Millisecond},
			{"rpc", 20 * time.Millisecond},
			{"transport/verbs/shm", 20 * time.Millisecond},
			{noFrame, 10 * time.Millisecond},
		}},
		{"by function", true, []share{
			{"transport/verbs/soft.(*QP).post", 50 * time.Millisecond},
			{"transport.(*Conn).onRecv", 40 * time.Millisecond},
			{"transport.(*Conn).call", 30 * time.Millisecond},
			{"rpc.(*Client).Invoke", 20 * time.Millisecond},
			{"transport/verbs/shm.(*ring).readable", 20 * time.Millisecond},
			{noFrame, 10 * time.Millisecond},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := split(cpuProfile(samples), tc.byFunc)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("split = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSplitRefusesOtherProfiles(t *testing.T) {
	p := cpuProfile(map[string]int64{"runtime.goexit": 1})
	p.SampleType = []*profile.ValueType{{Type: "contentions", Unit: "count"}, {Type: "delay", Unit: "nanoseconds"}}
	if _, err := split(p, false); err == nil || !strings.Contains(err.Error(), "not a CPU profile") {
		t.Fatalf("split of a mutex profile: err = %v, want one that says it is not a CPU profile", err)
	}
}

func TestReport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	p := cpuProfile(map[string]int64{module + "rpc.(*Server).handle": 30e6, "runtime.mcall": 10e6})
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var out bytes.Buffer
	if err := report(&out, path, false); err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{"| rpc | 0.03s | 75.0% |", "| " + noFrame + " | 0.01s | 25.0% |", "| total | 0.04s | |"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("report lacks %q:\n%s", row, out.String())
		}
	}
	out.Reset()
	if err := report(&out, path, true); err != nil {
		t.Fatal(err)
	}
	if want := "| function | CPU | share |"; !strings.Contains(out.String(), want) {
		t.Errorf("report -by function lacks its header %q:\n%s", want, out.String())
	}
	if err := report(&out, filepath.Join(t.TempDir(), "none.pprof"), false); err == nil {
		t.Error("report of a missing file: no error")
	}
}
