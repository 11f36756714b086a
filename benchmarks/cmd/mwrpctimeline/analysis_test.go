package main

import (
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
)

// synthCalls builds a phase of n calls on a common clock: each call is the client's
// CallBegin, a write of fast or slow duration, the server's read and Echo, and the client's
// CallEnd; every call in slowEvery also has an extra server write (another sequence).
func synthCalls(n, slowEvery int) *phase {
	ph := &phase{}
	t := int64(0)
	for i := 0; i < n; i++ {
		slow := slowEvery > 0 && i%slowEvery == 0
		w := int64(10_000) + int64(i%5)*100 // 10.0-10.4 µs write
		ph.client = append(ph.client,
			probe.Record{T: t, Step: probe.CallBegin},
			probe.Record{T: t + 1_000, Step: probe.Write, Aux: 64},
			probe.Record{T: t + 1_000 + w, Step: probe.WriteDone})
		s := t + 1_000 + w + 5_000
		ph.server = append(ph.server,
			probe.Record{T: s, Step: probe.Read},
			probe.Record{T: s + 2_000, Step: probe.ReadDone, Aux: 64},
			probe.Record{T: s + 3_000, Step: probe.Echo})
		end := s + 20_000
		if slow {
			ph.server = append(ph.server, probe.Record{T: s + 4_000, Step: probe.Write, Aux: 64})
			end += 50_000
		}
		ph.client = append(ph.client, probe.Record{T: end, Step: probe.CallEnd})
		// A mark after the call ended and before the next began.
		ph.server = append(ph.server, probe.Record{T: end + 1_000, Step: probe.Release})
		ph.lat = append(ph.lat, time.Duration(end-t))
		t = end + 100_000
	}
	return ph
}

func TestAnalyse(t *testing.T) {
	a := analyse(synthCalls(100, 10))
	if a.Calls != 100 || a.Variants != 2 {
		t.Fatalf("calls %d, sequences %d: want 100 and 2", a.Calls, a.Variants)
	}
	if a.Matched != 90 {
		t.Errorf("calls in the typical sequence: %d, want the 90 fast ones", a.Matched)
	}
	if len(a.Rows) != 7 {
		t.Fatalf("%d rows, want 7: %+v", len(a.Rows), a.Rows)
	}
	for i, want := range []probe.Step{probe.CallBegin, probe.Write, probe.WriteDone, probe.Read, probe.ReadDone, probe.Echo, probe.CallEnd} {
		if got := a.Rows[i].Step; len(got) < len(want.String()) || got[:len(want.String())] != want.String() {
			t.Errorf("row %d is %q, want %q", i, got, want)
		}
	}
	// The write takes 10.0-10.4 µs.
	if r := a.Rows[2]; r.DeltaUs < 10 || r.DeltaUs > 10.4 || r.Category != catWrite || r.Side != "client" {
		t.Errorf("write row %+v: want 10.0-10.4 µs, %q, client", r, catWrite)
	}
	// The server's read() returns 2 µs after it was called.
	if r := a.Rows[4]; r.DeltaUs != 2 || r.Category != catRead || r.Side != "server" {
		t.Errorf("read row %+v: want 2 µs, %q, server", r, catRead)
	}
	if got := a.Syscalls["C write/writev"]; got != 1 {
		t.Errorf("client writes per call %v, want 1", got)
	}
	if got := a.Syscalls["S write/writev"]; got != 0.1 {
		t.Errorf("server writes per call %v, want 0.1 (one call in ten)", got)
	}
	if len(a.After) != 1 {
		t.Errorf("after the call: %q, want the one Release mark", a.After)
	}
	if sum := a.SumOfMedian; sum < a.MatchedP50-1 || sum > a.MatchedP50+1 {
		t.Errorf("rows add up to %.1f µs, the band's p50 is %.1f", sum, a.MatchedP50)
	}
}

func TestAnalyseNoCalls(t *testing.T) {
	a := analyse(&phase{})
	if a.Calls != 0 || len(a.Rows) != 0 {
		t.Fatalf("an empty phase gave %d calls and %d rows", a.Calls, len(a.Rows))
	}
}
