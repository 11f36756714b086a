package bench

import (
	"testing"
	"time"
)

// slowInstance answers each call after a millisecond and allocates nothing: a round has
// few calls, as at 1 MiB and one caller, so whatever the harness itself allocates while it
// counts shows per call.
type slowInstance struct{ fakeInstance }

func (slowInstance) Call(int) error { time.Sleep(time.Millisecond); return nil }

// TestAllocsAreTheCalls: allocs/op counts the calls' allocations, not the harness's
// bookkeeping around the round (reading CPU times and run-queue waits from /proc
// allocates): a system that allocates nothing per call reports well under one.
func TestAllocsAreTheCalls(t *testing.T) {
	sys := System{Name: "slow", Open: func(int, int) (Instance, error) { return slowInstance{}, nil }}
	cfg := Config{Systems: []System{sys}, Payloads: []int{64}, Concurrency: []int{1},
		Duration: 100 * time.Millisecond, Warmup: 20 * time.Millisecond, Rounds: 3, Mode: ModeInProcess}
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.AllocsPerOp > 0.5 {
			t.Errorf("%s: %.2f allocs/op for calls that allocate nothing: the harness counts its own", r.System, r.AllocsPerOp)
		}
	}
}
