package idle

import "time"

// Spinner is a spin budget (max at most) adapted to what spinning achieves: a spin that
// ends with what it waited for doubles the next budget, one that ends in sleep halves it.
// A fitting Spinner (NewFitSpinner) sets it instead to twice the whole wait when that was
// within max: a spin a little too short grows at once to one that wins, where halving
// would shrink it to SpinFloor for good. Spinning pays when the peer answers within the budget (a
// round trip through a running peer); when it does not (a peer that is descheduled, as on
// a busy machine with fewer cores than spinning threads, or a peer that is idle, or one
// copying a large message) the spin only burns CPU the peer may need before the sleep
// comes anyway. The budget never reaches 0: a wait always polls at least SpinFloor. A
// Spinner is owned by one goroutine at a time (its user's lock, or its user's goroutine).
type Spinner struct {
	max, cur time.Duration
	fit      bool
}

// SpinFloor is the least a Spinner polls before sleeping once its budget has shrunk: short
// against a sleep and wake-up (some microseconds of CPU on each side), long enough for a
// peer running on another core to answer a small frame.
const SpinFloor = 2 * time.Microsecond

// NewSpinner returns a Spinner whose budget starts at max; max 0 never spins.
func NewSpinner(max time.Duration) Spinner { return Spinner{max: max, cur: max} }

// NewFitSpinner returns a fitting Spinner whose budget starts at max: one for waits that
// only spin while cores are idle (Quiet), so that spinning as long as the waits take
// costs nobody.
func NewFitSpinner(max time.Duration) Spinner { return Spinner{max: max, cur: max, fit: true} }

// Budget is how long the next wait may spin.
func (s *Spinner) Budget() time.Duration { return s.cur }

// Max is the most Budget can be.
func (s *Spinner) Max() time.Duration { return s.max }

// Won records a spin that ended with what it waited for.
func (s *Spinner) Won() { s.cur = min(s.max, 2*s.cur) }

// Lost records a spin that ended in sleep, and the whole wait, spin and sleep, that
// followed it: waited.
func (s *Spinner) Lost(waited time.Duration) {
	if s.fit && waited <= s.max {
		s.cur = min(s.max, max(2*waited, SpinFloor))
		return
	}
	s.cur = max(min(s.max, SpinFloor), s.cur/2)
}

// Poll calls ready until it reports true, for at most budget, and reports whether it did
// and when it began. It reads the clock once every every calls and yields the P there
// (yielder), so that the goroutine that will make ready true may run on it; with
// whileQuiet it also stops once the process is no longer Quiet.
func Poll(budget time.Duration, every int, whileQuiet bool, ready func() bool) (start time.Time, ok bool) {
	start = time.Now()
	var y yielder
	for {
		for range every {
			if ready() {
				return start, true
			}
		}
		since := time.Since(start)
		if since > budget || whileQuiet && !Quiet() {
			return start, false
		}
		y.yield(since)
	}
}
