// Package parcopy copies large buffers with the help of idle cores.
//
// One core copies about 10-15 GB/s, so a 1 MiB payload takes 50-110 µs to copy on the
// 16-core machine of docs/performance.md, and a READ over the shm fabric is such a copy,
// made by the owner of the memory. Copy splits a large copy into pieces that the calling
// goroutine and up to maxHelpers helper goroutines copy at once, so that a machine with
// idle cores finishes it in a fraction of the time.
//
// Helpers are asked only while Ps are idle (runtime/metrics: GOMAXPROCS less the
// goroutines running or waiting to run), so that on a machine whose cores are all busy a
// copy is the caller's alone, as the built-in copy's. The caller and the helpers claim
// pieces one at a time, the caller from the start: a helper that wakes late takes what is
// left, and the caller waits at most for the pieces helpers are in the middle of. Helpers
// are started on demand and end after idleExit without work, so a process that stops
// copying large buffers keeps none.
//
// Copy splits from 256 KiB, for memory that is resident on both sides (the shm fabric's
// regions and, over that fabric, a call's payload copied into registered memory:
// transport.Conn.CopyIn); CopyLarge and Clone, for a call's payload between the caller's
// memory and registered memory elsewhere, and for a clone into fresh memory, split only
// from 4 MiB (largeSplit says why).
package parcopy

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/mwrpc/mwrpc/internal/idle"
)

const (
	// minSplit is the smallest copy Copy splits: below it the hand-off (a helper's
	// wake-up, some microseconds) costs about what a second core saves.
	minSplit = 256 << 10
	// largeSplit is the smallest copy CopyLarge and Clone split. Split from
	// minSplit, a default client's 1 MiB call was slower on 16 cores (a clone's memory is
	// freshly allocated, zeroed by make and first touched by several cores at once), and
	// its 16 MiB call faster (benchmarks/results/2026-11-26-manycore-ab-parcopy).
	largeSplit = 4 << 20
	// minPiece is the smallest piece. Pieces are claimed one at a time, so a helper whose
	// core wakes late still takes the pieces left when it comes, and the caller, done with
	// the rest, waits at most for the pieces helpers are copying: one each.
	minPiece = 64 << 10
	// maxPieces bounds the pieces of one copy (those of a 16 MiB copy are 256 KiB).
	maxPieces = 64
	// maxHelpers bounds the helpers of the process: past four cores a copy is bound by
	// memory bandwidth rather than by cores.
	maxHelpers = 4
	// idleExit is how long a helper waits for work before it ends.
	idleExit = time.Second
)

// helpersFor is how many helpers a copy may have with procs Ps: none on machines of up
// to 3 (two cores are the caller's and its peer's), then one for every two Ps beyond the
// first two, up to maxHelpers.
func helpersFor(procs int) int { return min(maxHelpers, max(0, procs/2-1)) }

// idleHelpers is how many helpers a copy may have now: helpersFor the machine, but no
// more than the Ps that neither run nor have a goroutine waiting to run. On a machine
// whose cores are all busy a helper would only take CPU from the goroutines that wait
// (and add its wake-ups), so the caller copies alone.
func idleHelpers() int {
	h := helpersFor(runtime.GOMAXPROCS(0))
	if h == 0 {
		return 0
	}
	return min(h, idle.Procs())
}

var (
	// forceHelpers, when positive, replaces idleHelpers' answer (tests).
	forceHelpers atomic.Int32
	// work hands a job to a helper that waits for one. It is unbuffered: a send succeeds
	// only while a helper is parked on it, so work never queues behind busy helpers.
	work = make(chan *job)
	// alive counts the helpers that run, at most maxHelpers.
	alive atomic.Int32
	// splits counts the copies that were split (tests).
	splits atomic.Uint64
	// free holds the jobs no copy uses. (A sync.Pool would lose them: the last reference
	// is often a helper's, whose P's private slot no other P reaches.)
	free jobList
)

// Copy copies min(len(dst), len(src)) bytes from src to dst, as the built-in copy does,
// and returns how many. A copy of at least minSplit bytes between buffers that do not
// overlap is split over the caller and the helpers it finds idle, when the machine has
// cores enough (helpersFor). It returns when every byte is copied. It is for memory that
// is resident on both sides, such as shared-memory regions.
func Copy(dst, src []byte) int { return copyFrom(dst, src, minSplit) }

// CopyLarge is Copy for a call's payload between the caller's memory and registered
// memory: it splits only copies of at least largeSplit bytes.
func CopyLarge(dst, src []byte) int { return copyFrom(dst, src, largeSplit) }

// copyFrom is Copy, splitting copies of at least least bytes.
func copyFrom(dst, src []byte, least int) int {
	n := min(len(dst), len(src))
	if n < least || overlap(dst[:n], src[:n]) {
		return copy(dst, src)
	}
	helpers := int(forceHelpers.Load())
	if helpers <= 0 {
		helpers = idleHelpers()
	}
	if helpers == 0 {
		return copy(dst, src)
	}
	splits.Add(1)
	j := free.get()
	j.start(dst[:n], src[:n], min(maxPieces, n/minPiece))
	j.handOut(min(helpers, int(j.pieces)-1))
	if !j.run() { // a helper copies the last piece: it says so
		<-j.finished
	}
	j.release()
	return n
}

// overlap reports whether a and b, of equal length, share a byte.
func overlap(a, b []byte) bool {
	if len(a) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// job is one split copy. Its owner is the goroutine in Copy; every helper handed it holds
// a reference until it is done with it, and the last reference puts it back in free.
type job struct {
	dst, src []byte
	piece    int          // bytes per piece; the last may be shorter
	pieces   int32        // how many
	next     atomic.Int32 // the next piece to claim
	done     atomic.Int32 // pieces copied
	refs     atomic.Int32 // Copy's and each helper's that was handed the job
	finished chan struct{}
}

// start readies j for a copy of src to dst in about pieces pieces, rounded to whole pages.
func (j *job) start(dst, src []byte, pieces int) {
	j.dst, j.src = dst, src
	j.piece = (len(src)/pieces + 4095) &^ 4095
	j.pieces = int32((len(src) + j.piece - 1) / j.piece)
	j.next.Store(0)
	j.done.Store(0)
	j.refs.Store(1)
}

// handOut offers j to up to k helpers: those parked on work first, then new ones while
// fewer than maxHelpers run. It stops at the first that none takes.
func (j *job) handOut(k int) {
	for range k {
		j.refs.Add(1)
		select {
		case work <- j:
			continue
		default:
		}
		if alive.Add(1) <= maxHelpers {
			go help(j)
			continue
		}
		alive.Add(-1)
		j.refs.Add(-1)
		return
	}
}

// run copies pieces until none is left to claim, and reports whether it copied the one
// that completed the job.
func (j *job) run() (last bool) {
	for {
		i := j.next.Add(1) - 1
		if i >= j.pieces {
			return last
		}
		lo := int(i) * j.piece
		hi := min(lo+j.piece, len(j.src))
		copy(j.dst[lo:hi], j.src[lo:hi])
		if j.done.Add(1) == j.pieces {
			last = true
		}
	}
}

// release drops a reference; the last puts j back, holding neither buffer.
func (j *job) release() {
	if j.refs.Add(-1) == 0 {
		j.dst, j.src = nil, nil
		free.put(j)
	}
}

// help is a helper: it works on j, then on every job handed to it, until it has waited
// idleExit for one.
func help(j *job) {
	defer alive.Add(-1)
	idle := time.NewTimer(idleExit)
	defer idle.Stop()
	for {
		if j.run() {
			j.finished <- struct{}{}
		}
		j.release()
		idle.Reset(idleExit)
		select {
		case j = <-work:
		case <-idle.C:
			return
		}
	}
}

// Clone returns a copy of b in memory of its own, as append([]byte(nil), b...) does (nil
// for an empty b), copied by CopyLarge.
func Clone(b []byte) []byte {
	if len(b) < largeSplit {
		return append([]byte(nil), b...)
	}
	out := make([]byte, len(b))
	CopyLarge(out, b)
	return out
}

// SetHelpers makes every split copy use n helpers, whatever the machine and its load (0:
// as many as idleHelpers finds), and returns what undoes it. It is for tests, which run on machines too small to
// split a copy: the module's tests of large calls use it to run the split path.
func SetHelpers(n int) (restore func()) {
	old := forceHelpers.Swap(int32(n))
	return func() { forceHelpers.Store(old) }
}

// Splits is how many copies were split since the process started.
func Splits() uint64 { return splits.Load() }

// jobList is a list of jobs under a lock, kept to maxFree.
type jobList struct {
	mu   sync.Mutex
	jobs []*job
}

// maxFree bounds the jobs kept: one for each copy that may run at once, about.
const maxFree = 64

// get takes a kept job, or makes one.
func (l *jobList) get() *job {
	l.mu.Lock()
	if n := len(l.jobs); n > 0 {
		j := l.jobs[n-1]
		l.jobs = l.jobs[:n-1]
		l.mu.Unlock()
		return j
	}
	l.mu.Unlock()
	return &job{finished: make(chan struct{}, 1)}
}

// put keeps j, unless maxFree are kept.
func (l *jobList) put(j *job) {
	l.mu.Lock()
	if len(l.jobs) < maxFree {
		l.jobs = append(l.jobs, j)
	}
	l.mu.Unlock()
}
