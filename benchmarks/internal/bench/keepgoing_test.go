package bench

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// fakeInstance answers calls, or fails every one with err.
type fakeInstance struct{ err error }

func (f fakeInstance) Call(int) error         { return f.err }
func (f fakeInstance) Copied() (uint64, bool) { return 0, false }
func (f fakeInstance) Close() error           { return nil }

// TestKeepGoing: with KeepGoing a system that fails leaves its cell, told to OnFailure,
// and the others are measured; without it the run ends with the error.
func TestKeepGoing(t *testing.T) {
	broken := errors.New("stream closed")
	systems := []System{
		{Name: "good", Open: func(int, int) (Instance, error) { return fakeInstance{}, nil }},
		{Name: "bad", Open: func(int, int) (Instance, error) { return fakeInstance{err: broken}, nil }},
		{Name: "nosetup", Open: func(int, int) (Instance, error) { return nil, broken }},
	}
	cfg := Config{Systems: systems, Payloads: []int{64}, Concurrency: []int{1, 2}, Duration: 10 * time.Millisecond,
		Warmup: time.Millisecond, Rounds: 2, Mode: ModeInProcess}
	if _, err := Run(cfg); !errors.Is(err, broken) {
		t.Fatalf("without KeepGoing: %v, want the failure", err)
	}
	var left []string
	cfg.KeepGoing = true
	cfg.OnFailure = func(c Cell, system string, err error) {
		left = append(left, c.String()+" "+system+": "+err.Error())
	}
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].System != "good" || res[1].System != "good" {
		t.Errorf("results %+v, want the good system's two cells", res)
	}
	if len(left) != 4 || !strings.Contains(strings.Join(left, "\n"), "bad: bad: warm-up: stream closed") {
		t.Errorf("OnFailure heard %q, want bad and nosetup in each of the 2 cells", left)
	}
}
