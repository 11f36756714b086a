package shm

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond for up to 5 s, failing t with what if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(50 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %s", what)
		}
	}
}

// polling and watching read a group's state under its lock.
func (g *pollGroup) pollingNow() int { g.mu.Lock(); defer g.mu.Unlock(); return g.polling }
func (g *pollGroup) watching() int   { g.mu.Lock(); defer g.mu.Unlock(); return len(g.watched) }

// waitResult is how one watcher.wait ended.
type waitResult struct {
	ok bool
	at time.Time
}

// startWait runs w.wait on a goroutine of its own and returns where its result comes.
func startWait(w *watcher, budget, watchFor time.Duration) <-chan waitResult {
	out := make(chan waitResult, 1)
	go func() {
		_, ok := w.wait(budget, watchFor, false)
		out <- waitResult{ok, time.Now()}
	}()
	return out
}

// stillWaiting fails t with why if the wait done reports on has ended.
func stillWaiting(t *testing.T, done <-chan waitResult, why string) {
	t.Helper()
	select {
	case <-done:
		t.Fatal(why)
	default:
	}
}

// endsReady fails t unless the wait done reports on ends, within 5 s, with its ring ready.
func endsReady(t *testing.T, done <-chan waitResult, what string) {
	t.Helper()
	select {
	case r := <-done:
		if !r.ok {
			t.Fatalf("%s ended without its data", what)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not end within 5s of its data", what)
	}
}

// twoReaders is a group where one reader may poll at a time, with a reader polling (a,
// for up to 10 s) and a second watched (b, its own budget spent at once, watched for up to
// 10 s). Each ring has data once its flag is set.
type twoReaders struct {
	g              *pollGroup
	readyA, readyB atomic.Bool
	b              *watcher
	doneA, doneB   <-chan waitResult
}

func startTwoReaders(t *testing.T) *twoReaders {
	t.Helper()
	r := &twoReaders{g: &pollGroup{limit: 1}}
	a := newWatcher(r.g, r.readyA.Load)
	r.b = newWatcher(r.g, r.readyB.Load)
	r.doneA = startWait(a, 10*time.Second, 0)
	waitFor(t, "the first reader polls", func() bool { return r.g.pollingNow() == 1 })
	r.doneB = startWait(r.b, time.Microsecond, 10*time.Second)
	waitFor(t, "the second reader is watched", func() bool { return r.g.watching() == 1 })
	return r
}

// TestPollGroupServesWatched: with one reader polling at a time, a second waits watched,
// its ring polled by the first, and wakes with its data while the first goes on polling.
func TestPollGroupServesWatched(t *testing.T) {
	tr := startTwoReaders(t)
	g, b, doneA, doneB := tr.g, tr.b, tr.doneA, tr.doneB
	tr.readyB.Store(true) // only watching finds it: b's own budget is spent
	endsReady(t, doneB, "the watched reader's wait (woken by the poller)")
	if got := b.watchedN.Load(); got != 1 {
		t.Errorf("watched waits counted %d, want 1", got)
	}
	stillWaiting(t, doneA, "the poller stopped without its data")
	tr.readyA.Store(true)
	endsReady(t, doneA, "the poller's wait")
	if p, w := g.pollingNow(), g.watching(); p != 0 || w != 0 {
		t.Fatalf("after both waits: %d polling, %d watched, want none", p, w)
	}
}

// TestPollGroupHandsOver: a poller whose data came hands its turn to the watched reader,
// which then polls its own ring for what is left of its wait.
func TestPollGroupHandsOver(t *testing.T) {
	tr := startTwoReaders(t)
	g, doneA, doneB := tr.g, tr.doneA, tr.doneB
	tr.readyA.Store(true)
	endsReady(t, doneA, "the poller's wait")
	waitFor(t, "the watched reader took the turn", func() bool { return g.watching() == 0 && g.pollingNow() == 1 })
	time.Sleep(time.Millisecond) // past the watched reader's own budget: it polls on watchFor's
	stillWaiting(t, doneB, "the reader handed the turn stopped polling before its wait was over")
	tr.readyB.Store(true)
	endsReady(t, doneB, "the wait of the reader handed the turn")
	if p := g.pollingNow(); p != 0 {
		t.Fatalf("%d readers still hold a turn, want none", p)
	}
}

// TestPollGroupWatchEnds: a watched reader whose data does not come is sent to sleep once
// its wait is over, by the poller, which goes on polling.
func TestPollGroupWatchEnds(t *testing.T) {
	g := &pollGroup{limit: 1}
	var readyA, never atomic.Bool
	a, b := newWatcher(g, readyA.Load), newWatcher(g, never.Load)
	doneA := startWait(a, 10*time.Second, 0)
	waitFor(t, "the first reader polls", func() bool { return g.pollingNow() == 1 })
	began := time.Now()
	doneB := startWait(b, time.Microsecond, 5*time.Millisecond)
	select {
	case r := <-doneB:
		if r.ok {
			t.Fatal("a ring that never became ready was reported ready")
		}
		if took := r.at.Sub(began); took < 5*time.Millisecond {
			t.Errorf("the watched wait ended after %v, before its 5ms", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a watched reader whose wait was over was not sent to sleep within 5s")
	}
	readyA.Store(true)
	endsReady(t, doneA, "the poller's wait")
}

// TestPollGroupLimit: under many readers whose rings become ready at random, no more
// readers hold a turn than the limit, a watched reader always has a poller to watch it
// (none is left waiting with nobody polling), every wait ends, and nothing is left in the
// group.
func TestPollGroupLimit(t *testing.T) {
	const limit, readers, waits = 2, 12, 200
	g := &pollGroup{limit: limit}
	flags := make([]atomic.Bool, readers)
	stop := make(chan struct{})
	var broken atomic.Pointer[string]
	var toggler sync.WaitGroup
	toggler.Add(1)
	go func() { // data comes to the rings at random; the group's state is checked between
		defer toggler.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			flags[rand.IntN(readers)].Store(true)
			g.mu.Lock()
			p, w := g.polling, len(g.watched)
			g.mu.Unlock()
			if p > limit || w > 0 && p == 0 {
				msg := fmt.Sprintf("%d readers hold a turn and %d are watched (limit %d)", p, w, limit)
				broken.Store(&msg)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWatcher(g, func() bool { return flags[i].Swap(false) })
			for range waits {
				w.wait(time.Duration(rand.IntN(200))*time.Microsecond, time.Duration(rand.IntN(400))*time.Microsecond, false)
			}
		}()
	}
	wg.Wait()
	close(stop)
	toggler.Wait()
	if msg := broken.Load(); msg != nil {
		t.Error(*msg)
	}
	if p, w := g.pollingNow(), g.watching(); p != 0 || w != 0 {
		t.Fatalf("after every wait: %d polling, %d watched, want none", p, w)
	}
}

// TestPollGroupUncrowded: a group with no more members than may poll at once takes no
// turns (its readers poll on their own, taking no lock); one member more crowds it, and a
// member that quits (twice) uncrowds it again.
func TestPollGroupUncrowded(t *testing.T) {
	g := &pollGroup{limit: 1}
	var ready atomic.Bool
	a := newWatcher(g, ready.Load)
	if g.crowded.Load() {
		t.Fatal("one member of a group of one poller: crowded")
	}
	done := startWait(a, 10*time.Second, 0)
	for range 20 {
		if p := g.pollingNow(); p != 0 {
			t.Fatalf("a lone reader took a turn (%d polling)", p)
		}
		time.Sleep(100 * time.Microsecond)
	}
	ready.Store(true)
	endsReady(t, done, "the lone reader's wait")
	b := newWatcher(g, ready.Load)
	if !g.crowded.Load() {
		t.Fatal("two members of a group of one poller: not crowded")
	}
	b.quit()
	b.quit()
	if g.crowded.Load() || g.members != 1 {
		t.Fatalf("after a member quit twice: crowded %v, %d members, want false and 1", g.crowded.Load(), g.members)
	}
}
