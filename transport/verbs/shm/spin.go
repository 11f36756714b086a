package shm

import (
	"time"

	"github.com/mwrpc/mwrpc/internal/idle"
)

// waitSpin is one direction's spinning: its spinner, and a reader's second, longer one
// (Config.QuietSpin at most) that it uses while the process is quiet (idle.Quiet: cores to
// spare, few goroutines running). There a round trip through a running peer takes 5-15 µs
// and a wake-up from sleep about as long again, so a reader whose budget has halved below
// its waits sleeps on nearly every call; one that spins on an idle core sees the answer as
// it lands. The quiet spinner fits itself to the waits (idle.NewFitSpinner), so a peer
// that answers slower than it (a large copy) soon costs no more than before. Owned by the
// holder of the direction's lock (rmu or wmu).
type waitSpin struct {
	normal, quiet idle.Spinner
}

func newWaitSpin(normal, quiet time.Duration) waitSpin {
	return waitSpin{normal: idle.NewSpinner(normal), quiet: idle.NewFitSpinner(quiet)}
}

// pick returns the spinner for the wait about to begin.
func (w *waitSpin) pick() *idle.Spinner {
	if w.quiet.Max() > 0 && idle.Quiet() {
		return &w.quiet
	}
	return &w.normal
}
