package shm

import "time"

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
