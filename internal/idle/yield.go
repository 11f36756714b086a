package idle

import (
	"runtime"
	"time"
	_ "unsafe" // go:linkname
)

// yielder yields a polling goroutine's P between its polls, the cheaper way while the P
// has nothing else to run, and the kinder way once it has.
//
// runtime.Gosched puts the goroutine on the global run queue under the scheduler's one
// lock, and the next pass of the scheduler takes the lock again to find it: on 16 cores,
// two processes of 8 Ps each at 64 callers over shm, most Ps idle, 40% of the server's CPU
// was in Gosched and a quarter of all of it spinning on that lock (docs/performance.md).
// The runtime's goyield puts it at the tail of its P's own queue, taking no lock; an idle
// P steals from there what waits. But from the global queue the scheduler takes the
// poller back only once its P has nothing else to run, where from the tail of the P's
// queue it comes back after the work queued when it yielded, ahead of what that work
// readies: on 2 cores, one core a process, polling with goyield alone took 7-8% of the
// calls at 16 and 64 callers over shm.
//
// So a yielder uses goyield while its rounds (the polls and the yield between them) come
// back within aloneRound, which says that nothing else ran on the P, and Gosched for the
// rest of the wait once a round takes longer: other goroutines have work there, and the
// poller should wait behind all of them. It is owned by one polling goroutine.
type yielder struct {
	last  time.Duration // when the last round ended, as the wait's age
	busyP bool          // a round took longer than aloneRound: Gosched from now on
}

// aloneRound is the longest a round of polls and a yield takes when nothing else runs on
// the P: 64 polls of a ring and a yield take 0.3-0.5 µs on the 2-core VM; a round in which
// another goroutine served a small call (1-2 µs of work) takes longer.
const aloneRound = time.Microsecond

// yield yields the P, the round having ended at since (the wait's age).
func (y *yielder) yield(since time.Duration) {
	if !y.busyP && since-y.last > aloneRound {
		y.busyP = true
	}
	y.last = since
	if y.busyP {
		runtime.Gosched()
		return
	}
	goyield()
}

// Yield yields the caller's P to the goroutines queued on it and resumes the caller once
// they ran or were stolen: goyield, which puts the caller at the tail of its P's own run
// queue and takes no lock. runtime.Gosched puts it on the global run queue under the
// scheduler's one lock, which the next pass of every P's scheduler takes again: on many
// cores, waiters that yield at every call serialize there. It is for a goroutine that
// waits for ones it just readied (they are queued on its P), not for a poller that should
// wait behind everything else (yielder).
func Yield() { goyield() }

// goyield is the runtime's, kept for the packages that link to it (go.dev/issue/67401):
// its signature does not change.
//
//go:linkname goyield runtime.goyield
func goyield()
