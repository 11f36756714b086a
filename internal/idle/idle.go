// Package idle tells whether this process has cores to spare right now: the Ps that
// neither run a goroutine nor have one waiting to run (runtime/metrics). Spinning waiters
// and copy helpers ask before they take a core. The figures are read for the whole
// process at most every refresh, so asking costs a clock read and an atomic load.
package idle

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
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

// quietBusy is the most goroutines running or waiting to run while Quiet is true: a
// waiter that spins and the one it waits on.
const quietBusy = 2

var (
	mu      sync.Mutex // held by the goroutine reading the figures
	samples = [...]metrics.Sample{
		{Name: "/sched/goroutines/running:goroutines"},
		{Name: "/sched/goroutines/runnable:goroutines"},
	}
	readNanos atomic.Int64 // unix nanos of the last reading
	busy      atomic.Int64 // goroutines running and runnable at the last reading
	procs     atomic.Int64 // GOMAXPROCS at procsAt
	procsAt   atomic.Int64
)

// Procs returns the Ps that neither run a goroutine nor have one waiting, as of a reading
// at most refresh old, and never less than zero.
func Procs() int {
	b, p := read()
	return int(max(0, p-b))
}

// Quiet reports whether the process is all but idle: GOMAXPROCS at least 4 and at most
// two goroutines running or waiting to run. A waiter may spin then rather than park: the
// core it takes is one nobody wants, and the wake-up it saves (a futex and a pass of the
// scheduler, 5-20 µs on a many-core machine) is most of a small call's latency.
func Quiet() bool {
	if f := forced.Load(); f != 0 {
		return f > 0
	}
	now := time.Now().UnixNano()
	if maxProcs(now) < minQuietProcs { // never quiet: no need to read the rest
		return false
	}
	b, _ := readAt(now)
	return b <= quietBusy
}

// forced, when not 0, is Quiet's answer: 1 true, -1 false (ForceQuiet).
var forced atomic.Int32

// ForceQuiet makes Quiet answer quiet until the returned func is called. It is for tests
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

// read returns the goroutines running and runnable and GOMAXPROCS (readAt).
func read() (busyNow, procsNow int64) { return readAt(time.Now().UnixNano()) }

// readAt is read at unix nanos now: the figures are read anew when the last reading is
// older than refresh and no other goroutine is reading them.
func readAt(now int64) (busyNow, procsNow int64) {
	p := maxProcs(now)
	if now-readNanos.Load() > int64(refresh) && mu.TryLock() {
		metrics.Read(samples[:])
		n := int64(0)
		for _, s := range samples {
			if s.Value.Kind() == metrics.KindUint64 { // a runtime without them: idle
				n += int64(s.Value.Uint64())
			}
		}
		busy.Store(n)
		readNanos.Store(now)
		mu.Unlock()
	}
	return busy.Load(), p
}

// maxProcs is GOMAXPROCS, read anew at unix nanos now when the last reading is older than
// procsRefresh.
func maxProcs(now int64) int64 {
	if now-procsAt.Load() > int64(procsRefresh) {
		procs.Store(int64(runtime.GOMAXPROCS(0)))
		procsAt.Store(now)
	}
	return procs.Load()
}
