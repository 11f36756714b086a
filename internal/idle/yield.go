package idle

import (
	_ "unsafe" // go:linkname
)

// Yield gives the P this goroutine runs on to the goroutines waiting in the P's own run
// queue, and returns when the scheduler comes back to it: the goroutines this one just
// readied (a woken caller, a NIC engine, the peer's data's reader) run first, on this P
// or, on a machine with Ps to spare, stolen by another.
//
// It is what a polling waiter calls between polls instead of runtime.Gosched, which puts
// the goroutine on the global run queue under the scheduler's one lock, and whose next
// pass of the scheduler takes that lock again to find it: on 16 cores, two processes of 8
// Ps each at 64 callers over shm, 40% of the server's CPU was in Gosched and a quarter of
// all of it spinning on that lock (docs/performance.md). Yield puts the goroutine at the
// tail of its P's queue, which takes no lock; goroutines on the global queue are still
// served, as the scheduler takes one from there every 61 of its passes.
//
// It is the runtime's goyield, which the runtime keeps for the packages that link to it
// (go.dev/issue/67401): its signature does not change.
func Yield() { goyield() }

//go:linkname goyield runtime.goyield
func goyield()
