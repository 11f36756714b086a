package transport

import (
	"sync/atomic"

	"github.com/mwrpc/mwrpc/internal/idle"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// deferPoster is a QP that can queue a message without transmitting it, for the next
// transmission to take (soft's QP.PostSendDeferred and QP.Flush). Over a socket a
// transmission is a write(2), which on loopback also runs the receiver's TCP input: some
// microseconds of the poster's CPU, the largest part of a small call's cost.
type deferPoster interface {
	PostSendDeferred(wrs []verbs.SendWR) (deferred bool, err error)
	Flush()
}

// corks holds a connection's requests back while callers its poller just woke are about
// to post theirs, so that they leave together. One read of the socket brings the responses
// of several callers; the poller wakes each, and each, resumed, posts its next request: one
// write each where they could share one. A request posted while woken callers have not
// resumed yet is queued (PostSendDeferred) and corks the QP; the last of them to resume
// uncorks it (Flush), and so does any request posted when none is pending. The wait is
// bounded by the scheduler, not by the woken callers: a poster that corked yields its P
// (idle.Yield, so the woken callers queued there run first) at most corkYields times,
// and then flushes itself if the QP is still corked, so a woken caller that is slow to
// resume, or never posts again, holds nobody's request for longer than a few passes of
// the run queue.
//
// Only unary requests are held back; one caller (woken 0 or 1) posts as before. The
// counts are atomics outside Conn.mu: the order of corked's store and woken's load on one
// side, and of woken's decrement and corked's swap on the other, is Dekker's, so either
// the poster sees no caller pending or the last caller sees the cork.
type corks struct {
	woken  atomic.Int32 // callers whose responses were delivered and who have not resumed
	corked atomic.Bool  // a request was queued and not transmitted
	never  atomic.Bool  // the QP defers nothing: no deferPoster, or its writes are no system calls (shm, in-process, TLS)
}

// corkMax is the largest request held back, envelope and gathered buffer included.
// Measured on the 2-core VM, one core a side: requests of 64 B and 4 KiB at 16 and 64
// callers gained 1.2x to 2.5x the calls; 64 KiB ones lost (0.76x at 64 callers): a write
// of 64 KiB is mostly its copy, and several held together fill the socket, which leaves
// the rest to the NIC engine. 8 KiB takes a 4 KiB body with its envelope; sizes from
// there to 64 KiB were not measured.
const corkMax = 8 << 10

// wake counts cl, whose response is delivered, as a caller about to resume.
func (c *Conn) wake(cl *call) {
	if !c.corks.never.Load() {
		cl.woke = true
		c.corks.woken.Add(1)
	}
}

// resumed is called by cl's caller once it has its response: the last caller to resume
// transmits the requests held back for it.
func (c *Conn) resumed(cl *call) {
	if !cl.woke {
		return
	}
	cl.woke = false
	if c.corks.woken.Add(-1) == 0 {
		c.uncork()
	}
}

// uncork transmits what was held back, if anything was.
func (c *Conn) uncork() {
	if c.corks.corked.Load() && c.corks.corked.Swap(false) {
		c.corker.Flush()
	}
}

// corkable reports whether a request of n bytes about to be posted may wait for others.
func (c *Conn) corkable(n int) bool {
	return n <= corkMax && c.corks.woken.Load() > 0 && !c.corks.never.Load()
}

// postCorked queues a request's work requests for the next transmission (corkable),
// where the QP defers them, and reports whether it did.
func (c *Conn) postCorked(wrs []verbs.SendWR) (bool, error) {
	deferred, err := c.corker.PostSendDeferred(wrs)
	if !deferred || err != nil {
		if err == nil {
			c.corks.never.Store(true) // the QP's link is for its life: ask no more
		}
		return false, err
	}
	c.corks.corked.Store(true)
	c.hot.corked.Add(1)
	if c.corks.woken.Load() == 0 { // the last caller resumed before the cork was seen
		c.uncork()
	}
	return true, nil
}

// corkYields is how many times a poster that held its request back yields its P while
// woken callers have yet to resume, before it sends what is held itself. With callers on
// more than one core, one yield often ended before the callers resuming on the other had
// posted: on 2 cores, both processes on both, four took 64 B at 16 callers from 57-59k to
// 80-81k calls/s and 4 KiB at 64 callers 1.25-1.33x (3 or 4 of 4 alternating pairs).
const corkYields = 4

// afterCork bounds a corked request's wait: the woken callers queued on this P run, then
// whatever is still held back leaves.
func (c *Conn) afterCork() {
	for i := 0; i < corkYields && c.corks.corked.Load(); i++ {
		idle.Yield()
		if c.corks.woken.Load() == 0 {
			break
		}
	}
	c.uncork()
}
