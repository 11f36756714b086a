// Package idle tells whether this process has cores to spare right now (runtime/metrics):
// the Ps that neither run a goroutine nor have one waiting to run, for copy helpers, and
// whether the process is all but idle, for spinning waiters. The figures are read for the
// whole process at most every refresh, so asking costs a clock read and atomic loads.
package idle

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/internal/clock"
)

// refresh is the most a reading is reused for: a scheduler's state changes every few
// microseconds under load, and one reading costs about 100 ns and a lock of the runtime's.
const refresh = 10 * time.Microsecond

// procsRefresh is the most GOMAXPROCS is reused for: it rarely changes, and reading it
// takes the scheduler's lock.
const procsRefresh = time.Millisecond

// minQuietProcs is the least GOMAXPROCS at which Quiet can be true: below it the process
// shares its few cores with its peer (two processes on a 2-core machine), where a spin
// takes the core the peer needs to answer.
const minQuietProcs = 4

// quietBusy is the most goroutines running, waiting to run or in a system call while
// Quiet is true with procs Ps, in each of the last two readings: half the Ps less one (a
// waiter that spins, the one it waits on and what else a caller at a time wakes), and at
// least 2.
func quietBusy(procs int64) int64 { return max(2, procs/2-1) }

var (
	mu      sync.Mutex // held by the goroutine reading the figures
	samples = [...]metrics.Sample{
		{Name: "/sched/goroutines/running:goroutines"},
		{Name: "/sched/goroutines/runnable:goroutines"},
		// In a system call: a loaded process on a socket spends a third of its CPU
		// there, and a count without them found it quiet at 16 callers.
		{Name: "/sched/goroutines/not-in-go:goroutines"},
	}
	readNanos atomic.Int64 // clock.Nanos of the last reading
	onPs      atomic.Int64 // goroutines running and runnable at the last reading
	busy      atomic.Int64 // those and the goroutines in system calls
	busyPrev  atomic.Int64 // busy at the reading before
	procs     atomic.Int64 // GOMAXPROCS at procsAt
	procsAt   atomic.Int64
)

// MaxProcs returns GOMAXPROCS as of a reading at most procsRefresh old:
// runtime.GOMAXPROCS takes the scheduler's lock, too dear for a wait that begins at every
// call on many cores.
func MaxProcs() int { return int(maxProcs(clock.Nanos())) }

// Procs returns the Ps that neither run a goroutine nor have one waiting to run, as of a
// reading at most refresh old, and never less than zero.
func Procs() int {
	now := clock.Nanos()
	p := maxProcs(now)
	refreshAt(now)
	return int(max(0, p-onPs.Load()))
}

// Quiet reports whether the process is all but idle: GOMAXPROCS at least 4 and at most
// half of it less one goroutines running, waiting to run or in a system call (3 of 8), in
// each of the last two readings (an instant between two bursts of a loaded process is not
// quiet). A waiter may spin then rather than park: the core it takes is one nobody wants,
// and the wake-up it saves (a futex and a pass of the scheduler, 5-20 µs on a many-core
// machine) is most of a small call's latency.
func Quiet() bool {
	if f := forced.Load(); f != 0 {
		return f > 0
	}
	now := clock.Nanos()
	p := maxProcs(now)
	if p < minQuietProcs { // never quiet: no need to read the rest
		return false
	}
	refreshAt(now)
	q := quietBusy(p)
	return busy.Load() <= q && busyPrev.Load() <= q
}

// forced, when not 0, is Quiet's answer: 1 true, -1 false (ForceQuiet).
var forced atomic.Int32

// ForceQuiet makes Quiet answer quiet, whatever the process does, until the returned func
// is called. It is for tests
// of what waiters do when the process is quiet, which cannot make a test process quiet:
// the test's own goroutines run beside the waiters, and on a 2-core machine GOMAXPROCS is
// too small.
func ForceQuiet(quiet bool) (restore func()) {
	v := int32(-1)
	if quiet {
		v = 1
	}
	old := forced.Swap(v)
	return func() { forced.Store(old) }
}

// refreshAt reads the figures anew at now (clock.Nanos) when the last reading is older than
// refresh and no other goroutine is reading them.
func refreshAt(now int64) {
	if now-readNanos.Load() <= int64(refresh) || !mu.TryLock() {
		return
	}
	metrics.Read(samples[:])
	var n [len(samples)]int64
	for i, s := range samples {
		if s.Value.Kind() == metrics.KindUint64 { // a runtime without it: none
			n[i] = int64(s.Value.Uint64())
		}
	}
	onPs.Store(n[0] + n[1])
	busyPrev.Store(busy.Load())
	busy.Store(n[0] + n[1] + n[2])
	readNanos.Store(now)
	mu.Unlock()
}

// maxProcs is GOMAXPROCS, read anew at now (clock.Nanos) when the last reading is older
// than procsRefresh, or there is none.
func maxProcs(now int64) int64 {
	if now-procsAt.Load() > int64(procsRefresh) || procs.Load() == 0 {
		procs.Store(int64(runtime.GOMAXPROCS(0)))
		procsAt.Store(now)
	}
	return procs.Load()
}
