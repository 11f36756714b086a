package transport

import (
	"sync"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// scriptedCQ is a completion queue whose Poll runs onPoll (given the call's number, from
// 1) after it took its answer from queued.
type scriptedCQ struct {
	mu     sync.Mutex
	queued []verbs.WorkCompletion
	polls  int
	onPoll func(n int)
}

func (q *scriptedCQ) add(wc verbs.WorkCompletion) {
	q.mu.Lock()
	q.queued = append(q.queued, wc)
	q.mu.Unlock()
}

func (q *scriptedCQ) Poll(wcs []verbs.WorkCompletion) (int, error) {
	q.mu.Lock()
	q.polls++
	n := q.polls
	k := copy(wcs, q.queued)
	q.queued = q.queued[k:]
	q.mu.Unlock()
	if q.onPoll != nil { // what it adds comes after this Poll
		q.onPoll(n)
	}
	return k, nil
}

func (q *scriptedCQ) ReqNotify() error        { return nil }
func (q *scriptedCQ) Notify() <-chan struct{} { return nil }
func (q *scriptedCQ) Cap() int                { return 64 }
func (q *scriptedCQ) Destroy() error          { return nil }

// TestReapInlineMissed: a completion added while one reapInline holds the token, by a
// provider whose own reapInline therefore finds the token held, is reaped by the holder
// once it lets go. Before, the second only kicked the poller and the first returned: with
// the poller goroutine running a handler inline (the queue lent), the completion waited
// for that handler (TestLentQueueCatchesUp's rare 'took 1.05s while an inline handler ran
// 1s').
func TestReapInlineMissed(t *testing.T) {
	q := &scriptedCQ{}
	p := &poller{t: &Transport{}, cq: q, wake: make(chan struct{}, 1), wcs: make([]verbs.WorkCompletion, 8)}
	var dispatched []uint64
	hook := func(wc *verbs.WorkCompletion) { dispatched = append(dispatched, wc.WRID) }
	p.t.testHookWC.Store(&hook)
	q.onPoll = func(n int) {
		// Poll 1 is the holder's batch (empty), poll 2 the one after arming: a provider
		// adds a completion to the armed queue just then and runs its reapInline, which
		// finds the token held.
		if n == 2 {
			q.add(verbs.WorkCompletion{WRID: 42, Status: verbs.WCSuccess})
			done := make(chan struct{})
			go func() { p.reapInline(); close(done) }()
			<-done
		}
	}
	p.reapInline()
	if len(dispatched) != 1 || dispatched[0] != 42 {
		t.Fatalf("dispatched %v after the holder let go; want the completion a reapInline that found the token held added (42)", dispatched)
	}
	if p.missed.Load() {
		t.Error("missed is still set after the holder reaped for it")
	}
}

// TestArmLends: the completion arm's poll catches, just after arming, is a batch of its
// own: armed from the poller's idle path or a reaper it is dispatched lendable, so that a
// handler it starts inline lends the queue (runInline) rather than hold the token while
// every completion behind it waits (TestLentQueueCatchesUp's rare "answered only after an
// inline handler held for 10s", when the slow request came in just before the poller
// parked). Armed from runInline, with the queue lent already, it is not.
func TestArmLends(t *testing.T) {
	for _, lend := range []bool{true, false} {
		q := &scriptedCQ{}
		p := &poller{t: &Transport{}, cq: q, wake: make(chan struct{}, 1), wcs: make([]verbs.WorkCompletion, 8)}
		var lendable []bool
		hook := func(wc *verbs.WorkCompletion) { lendable = append(lendable, p.lendable) }
		p.t.testHookWC.Store(&hook)
		q.add(verbs.WorkCompletion{WRID: 7, Status: verbs.WCSuccess})
		if empty, err := p.arm(lend); empty || err != nil {
			t.Fatalf("arm(%v) with a completion queued: empty %v, err %v", lend, empty, err)
		}
		if len(lendable) != 1 || lendable[0] != lend {
			t.Errorf("arm(%v) dispatched %d completions, lendable %v; want one, lendable %v", lend, len(lendable), lendable, lend)
		}
		if p.lendable {
			t.Errorf("arm(%v) left lendable set", lend)
		}
	}
}
