package shm

import (
	"time"

	"github.com/mwrpc/mwrpc/internal/idle"
)

// spinner is one direction's spin budget (Config.Spin at most), adapted to what spinning
// achieves: a spin that ends with the ring ready doubles the next budget, one that ends in
// sleep halves it. Spinning pays when the peer answers within the budget (a round trip
// through a running peer); when it does not (a peer that is descheduled, as on a busy
// machine with fewer cores than spinning threads, or a peer that is idle) the spin only
// burns CPU the peer may need before the sleep comes anyway. The budget never reaches 0:
// a wait always polls at least spinFloor, so that a peer that answers fast again is seen
// and the budget grows back. Owned by the holder of the direction's lock (rmu or wmu).
type spinner struct {
	max, cur time.Duration
}

// spinFloor is the least a spinner polls before sleeping once its budget has shrunk:
// short against a sleep and wake-up (a doorbell write, an epoll wake-up and a read, some
// microseconds of CPU on each side), long enough for a peer running on another core to
// answer a small frame.
const spinFloor = 2 * time.Microsecond

func newSpinner(max time.Duration) spinner { return spinner{max: max, cur: max} }

func (s *spinner) budget() time.Duration { return s.cur }

func (s *spinner) won() { s.cur = min(s.max, 2*s.cur) }

func (s *spinner) lost() { s.cur = max(min(s.max, spinFloor), s.cur/2) }

// waitSpin is one direction's spinning: its spinner, and a reader's second, longer one
// (QuietSpin at most, with the default Config.Spin) that it uses while the process is
// quiet (idle.Quiet: cores to spare, at most two goroutines running). There a round trip
// through a running peer takes 5-15 µs and a wake-up from sleep about as long again, so a
// reader that sleeps after 20 µs sleeps on nearly every call; one that spins on an idle
// core sees the answer as it lands. Both adapt alike, so a peer that answers slower than
// the long spin (a large copy) soon costs no more than before. Owned as spinner is.
type waitSpin struct {
	normal, quiet spinner
}

func newWaitSpin(normal, quiet time.Duration) waitSpin {
	return waitSpin{normal: newSpinner(normal), quiet: newSpinner(quiet)}
}

// pick returns the spinner for the wait about to begin.
func (w *waitSpin) pick() *spinner {
	if w.quiet.max > 0 && idle.Quiet() {
		return &w.quiet
	}
	return &w.normal
}
