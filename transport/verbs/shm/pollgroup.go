package shm

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/internal/clock"
	"github.com/mwrpc/mwrpc/internal/idle"
)

// pollGroup shares the polling of a process's ring readers, as a NIC's completion queue is
// polled for many queue pairs: at most limit readers poll at once, and a reader that would
// be one more is watched instead. A watched reader parks; a polling reader looks at its
// ring between polls of its own (every serveEvery) and wakes it when data comes, or when
// the watched reader's wait is over, so that it sleeps on its doorbell as it would have
// after spinning. A polling reader whose own wait ends hands its turn to a watched one.
//
// Without it every connection's reader polls: on 2 cores (two processes, e936201), a
// Client with two and four lanes over shm pinned did 0.36x and 0.22x one lane's calls at
// 64 B and 16 callers, its readers and the server's taking the cores the callers and the
// handlers needed. Sharing the polling gave two lanes 1.21x their calls there and four
// 1.12x (1.32x and 1.33x against shmipc-go in the same runs; four alternating pairs), and
// 1.05x and 1.18x at 64 callers. A server with a connection per client process has the
// same readers.
//
// The polling reader wakes a watched one with a channel send (a goroutine made ready on
// its P), no system call; the peer rings no doorbell for it, since a watched reader has
// not set its waiter flag. Lock rules: mu guards polling and watched; a watcher is in
// watched from join until the verdict sent to it, and gets exactly one verdict a wait.
//
// While a group has no more readers than may poll at once (one connection each way, the
// usual shape), nobody can be watched, and its readers poll on their own, as if there
// were no group: they take no lock (crowded).
type pollGroup struct {
	mu       sync.Mutex
	polling  int          // readers that hold a turn: polling, or woken to poll
	watched  []*watcher   // parked readers, the oldest first
	nWatched atomic.Int32 // len(watched), for pollers to look without mu
	limit    int          // how many readers may poll at once (0: half of GOMAXPROCS, pollers)
	members  int          // readers in the group: their connections are open
	crowded  atomic.Bool  // members > pollers() when members last changed
}

// The process's pollGroups: one for the readers of the connections it dialed (a Client's
// lanes: the answers to its calls), one for those it accepted (a server's: the calls
// coming in). In each at most half of GOMAXPROCS readers poll at once (lanes over shm open
// up to as many: rpc.WithLanes), one on 2 cores. A process that is both, as a service
// calling another, polls for either flow: with one group for both, a client and a server
// in one process took 1.6-1.8x the time a call at 32 callers (BenchmarkCall/shm, 2
// cores), each message a hand-off between the two readers.
var dialedReaders, acceptedReaders pollGroup

// pollers is how many readers of g may poll at once: its limit, or half of GOMAXPROCS and
// at least one.
func (g *pollGroup) pollers() int {
	if g.limit > 0 {
		return g.limit
	}
	return max(1, idle.MaxProcs()/2)
}

// serveEvery is how many polls of its own ring a polling reader makes between looks at
// the watched ones' (each a few loads of shared memory): a watched ring's data waits a
// fraction of a microsecond more than its own reader's poll would have.
const serveEvery = 16

// watcher is one reader's place in a pollGroup: its ring's check and what a wait needs.
// It is owned by the reader (Conn.rmu) except while watched, when the group's pollers
// read it under the group's mu.
type watcher struct {
	g        *pollGroup
	ready    func() bool  // the ring has data (or the connection ended): readReady
	poll     func() bool  // ready, and the group's watched rings now and then (pollReady)
	until    int64        // clock.Nanos at which this wait, watched, is over
	polls    uint32       // polls of its own ring since it last served the group
	wake     chan verdict // a watched wait's verdict
	watchedN atomic.Uint64
	gone     bool // quit: no longer a member (g.mu)
}

// verdict ends a watched wait.
type verdict uint8

const (
	verdictData  verdict = iota // its ring has data: read it
	verdictSleep                // its wait is over: sleep on the doorbell
	verdictPoll                 // a poller left: poll, for what is left of the wait
)

// newWatcher returns the watcher of a reader whose ring's check is ready, a member of g
// until quit.
func newWatcher(g *pollGroup, ready func() bool) *watcher {
	w := &watcher{g: g, ready: ready, wake: make(chan verdict, 1)}
	w.poll = w.pollReady
	g.mu.Lock()
	g.members++
	g.crowded.Store(g.members > g.pollers())
	g.mu.Unlock()
	return w
}

// quit takes w's reader out of its group: its connection closed. Only the first call
// counts.
func (w *watcher) quit() {
	g := w.g
	g.mu.Lock()
	if !w.gone {
		w.gone = true
		g.members--
		g.crowded.Store(g.members > g.pollers())
	}
	g.mu.Unlock()
}

// wait polls w's ring for up to budget, in turn with the group's other readers (with
// quiet, only while the process is quiet, as idle.Poll), and reports when it began and
// whether the ring became ready. Watched, it waits for up to watchFor (at least budget):
// a watched reader costs no CPU, so it waits as long as its spinner ever would, where its
// own budget may have shrunk to the floor while its connection idled, and an answer it
// then sleeps through costs a doorbell and a wake-up on each side, a wait longer than the
// spinner's most, after which the budget shrinks again.
func (w *watcher) wait(budget, watchFor time.Duration, quiet bool) (start time.Time, ok bool) {
	g := w.g
	if !g.crowded.Load() {
		return idle.Poll(budget, 64, quiet, w.ready)
	}
	if !g.join(w, max(budget, watchFor)) {
		start = time.Now()
		w.watchedN.Add(1)
		switch <-w.wake {
		case verdictData:
			return start, true
		case verdictSleep:
			return start, false
		}
		budget = time.Duration(w.until - clock.Nanos()) // verdictPoll: what is left of watchFor
	}
	began, ok := idle.Poll(budget, 64, quiet, w.poll)
	if start.IsZero() {
		start = began
	}
	g.leave()
	return start, ok
}

// pollReady is a polling reader's check: its own ring, and every serveEvery polls the
// watched ones'.
func (w *watcher) pollReady() bool {
	if w.ready() {
		return true
	}
	if w.g.nWatched.Load() > 0 {
		if w.polls++; w.polls%serveEvery == 0 {
			w.g.serve()
		}
	}
	return false
}

// join takes a turn to poll, or, when limit readers hold one, puts w among the watched,
// for up to watchFor, and reports false. The first reader to poll reads no clock.
func (g *pollGroup) join(w *watcher, watchFor time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.polling == 0 || g.polling < g.pollers() {
		g.polling++
		return true
	}
	w.until = clock.Nanos() + int64(watchFor)
	g.watched = append(g.watched, w)
	g.nWatched.Store(int32(len(g.watched)))
	return false
}

// leave gives up a turn: to the oldest watched reader whose wait is not over (those whose
// wait is over go to sleep), or back to the group.
func (g *pollGroup) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	var now int64
	for n := len(g.watched); n > 0; n-- {
		if now == 0 {
			now = clock.Nanos()
		}
		w := g.watched[0]
		copy(g.watched, g.watched[1:])
		g.watched[n-1] = nil
		g.watched = g.watched[:n-1]
		g.nWatched.Store(int32(n - 1))
		if now < w.until {
			w.wake <- verdictPoll
			return
		}
		w.wake <- verdictSleep
	}
	g.polling--
}

// serve wakes the watched readers whose ring is ready, with verdictData, and those whose
// wait is over, with verdictSleep. A poller that finds another serving goes on polling.
func (g *pollGroup) serve() {
	if !g.mu.TryLock() {
		return
	}
	defer g.mu.Unlock()
	now := clock.Nanos()
	kept := g.watched[:0]
	for _, w := range g.watched {
		switch {
		case w.ready():
			w.wake <- verdictData
		case now >= w.until:
			w.wake <- verdictSleep
		default:
			kept = append(kept, w)
		}
	}
	clear(g.watched[len(kept):])
	g.watched = kept
	g.nWatched.Store(int32(len(kept)))
}
