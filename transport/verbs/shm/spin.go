package shm

import (
	"time"

	"github.com/mwrpc/mwrpc/internal/idle"
)

// waitSpin is one direction's spinning: its spinner, and a reader's second, longer one
// (Config.QuietSpin at most) that it uses while the process is quiet (idle.Quiet: cores to
// spare, few goroutines running). Owned by the holder of the direction's lock (rmu or
// wmu).
//
// A reader's spinner fits itself to its waits (idle.NewFitSpinner): a wait that ended
// within Config.Spin sets the next spin to twice it. A halving spinner has two steady
// states at one caller, and falls into the wrong one for good: once a peer is late (a
// wake-up, a preemption), its answers come after a sleep and a wake-up on each side,
// later than the halved spin, which halves again, down to the floor, and both sides then
// sleep between all their calls. The fitting one spins long enough for the next such
// answer, meets it polling, and the peer, answered at once, answers at once too: 64 B at
// one caller over shm on 2 cores went from 57.5 to 3.4 µs p50 (docs/performance.md). A wait
// longer than Config.Spin (an idle connection, a large copy) still halves it. A writer's
// spinner, which waits for room in a full ring behind a reader copying large messages,
// halves.
type waitSpin struct {
	normal, quiet idle.Spinner
}

// copyRate is the copy speed a reader assumes of a peer copying for it, in bytes per
// nanosecond: 10 GB/s, below one core's 25-45 GB/s between shared regions on the 2-core
// VM of docs/performance.md, so that a peer slowed by a busy cache is still met polling.
// maxCopySpin bounds the polling a copy adds to one wait (a 16 MiB message's copy at
// that rate takes about 1.7 ms).
const (
	copyRate    = 10
	maxCopySpin = 2 * time.Millisecond
)

// copyTime is how long a peer takes to copy n bytes at copyRate, at most maxCopySpin.
// A reader whose peer copies a large message before answering (a placed WRITE it pulls,
// told through soft.SharedMemoryWire.PeerCopies, once since the last wait) polls for that
// long more: with the spin alone (Config.Spin, 50 µs) one caller's 1 MiB call found both
// readers asleep, each answer a doorbell and a wake-up (10-15 µs each way on 2 cores).
func copyTime(n int64) time.Duration {
	return min(maxCopySpin, time.Duration(n/copyRate))
}

// copyLateFit is the lateness a reader allows the next answer behind a copy, having allowed
// was and seen late (fitCopyLate).
func copyLateFit(was, late time.Duration) time.Duration {
	switch {
	case late <= 0:
		return 0
	case late > maxCopySpin:
		return was
	}
	return min(maxCopySpin, late+late/4)
}

// readSpin is a reader's waitSpin for cfg; writeSpin a writer's.
func readSpin(cfg Config) waitSpin {
	return waitSpin{normal: idle.NewFitSpinner(cfg.spin()), quiet: idle.NewFitSpinner(max(cfg.QuietSpin, 0))}
}

func writeSpin(cfg Config) waitSpin { return waitSpin{normal: idle.NewSpinner(cfg.spin())} }

// pick returns the spinner for the wait about to begin.
func (w *waitSpin) pick() *idle.Spinner {
	if w.quiet.Max() > 0 && idle.Quiet() {
		return &w.quiet
	}
	return &w.normal
}
