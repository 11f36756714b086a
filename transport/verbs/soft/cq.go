package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// cq is a completion queue: a ring guarded by a mutex, with a lock-free empty check so that
// a busy poller does not contend with the engines that fill it.
type cq struct {
	dev *Device

	n       atomic.Int32 // completions queued
	size    atomic.Int32 // len(ring), for Cap without mu
	armed   atomic.Bool  // ReqNotify asked for the next completion's notification
	closed  atomic.Bool  // destroyed: set under mu, read by ReqNotify without it
	mu      sync.Mutex
	ring    []verbs.WorkCompletion // grows by Resize
	head    int
	overrun atomic.Bool
	users   int // QPs
	notify  chan struct{}

	// An armed queue with a handler that a stream reader is filling does not send on
	// notify: the reader runs the handler once it has let go of the QP (verbs.DirectCQ).
	// Atomic: the reader that owes the notification reads it without mu.
	handler atomic.Pointer[func()]
	// defers counts the readers between beginDefer and endDefer, with owedBit set when a
	// completion found the queue armed while one was: atomic, so that bracketing a frame
	// takes no lock (each delivered frame did twice, on every CQ its QP completes to).
	defers atomic.Int64
}

// owedBit is the bit of cq.defers that says a deferring reader owes the armed queue's
// notification.
const owedBit = 1 << 62

// SetArmedHandler implements verbs.DirectCQ: the handler runs on the TCP fabric's stream
// readers. The in-process fabric has no goroutine of its own to lend, and keeps notifying.
func (c *cq) SetArmedHandler(fn func()) {
	if fn == nil {
		c.handler.Store(nil)
		return
	}
	c.handler.Store(&fn)
}

// beginDefer and endDefer bracket a stream reader's delivery of one frame, less its waits
// for payload bytes (it must not hold back, that long, completions others added). Whichever
// deferring reader ends first after an armed completion runs the handler: owedBit is set
// (owe) only while the count of deferring readers is above zero, by a compare-and-swap, so
// every reader that ends after it sees it and the first to clear it runs the handler; it
// is never lost. The reader holds its QP's rxMu but not q.mu then: the handler may need
// q.mu.
func (c *cq) beginDefer() { c.defers.Add(1) }

func (c *cq) endDefer() {
	if c.defers.Add(-1)&owedBit == 0 || c.defers.And(^owedBit)&owedBit == 0 {
		return // nothing owed, or another reader took it
	}
	switch fn := c.handler.Load(); {
	case fn == nil: // the handler was removed meanwhile: the token it replaced
		c.signal()
	default:
		// A reader must never block on a socket: two readers each blocked writing to the
		// other's full stream would deadlock. Work the handler posts is sent with writes that
		// never wait, or left to the engines (QP.transmitTryOnce).
		c.dev.readersReaping.Add(1)
		(*fn)()
		c.dev.readersReaping.Add(-1)
	}
}

// signal sends the armed queue's one Notify token (the channel holds one).
func (c *cq) signal() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func newCQ(d *Device, n int) *cq {
	c := &cq{dev: d, ring: make([]verbs.WorkCompletion, n), notify: make(chan struct{}, 1)}
	c.size.Store(int32(n))
	return c
}

func (c *cq) Cap() int { return int(c.size.Load()) }

// Resize implements verbs.CQResizer (ibv_resize_cq): the ring is copied, oldest
// completion first, into one of at least cqe entries. Like mlx5 it never shrinks below
// what is queued; a smaller cqe than the current size keeps the size.
func (c *cq) Resize(cqe int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int(c.n.Load())
	switch {
	case c.closed.Load():
		return fmt.Errorf("soft: resize CQ: %w", verbs.ErrClosed)
	case cqe <= 0 || cqe > maxCQE || cqe < n:
		return fmt.Errorf("soft: resize CQ to %d entries (%d queued, at most %d): %w", cqe, n, maxCQE, verbs.ErrInvalid)
	case cqe <= len(c.ring):
		return nil
	}
	ring := make([]verbs.WorkCompletion, cqe)
	k := copy(ring, c.ring[c.head:min(c.head+n, len(c.ring))])
	copy(ring[k:n], c.ring[:n-k])
	c.ring, c.head = ring, 0
	c.size.Store(int32(cqe))
	return nil
}
func (c *cq) Notify() <-chan struct{} { return c.notify }

// ReqNotify arms the queue. It takes no lock: push takes armed with a swap after it counts
// its completion, so a poller that polls again after arming sees the completion, or push
// sees the queue armed.
func (c *cq) ReqNotify() error {
	if c.closed.Load() {
		return fmt.Errorf("soft: req notify: %w", verbs.ErrClosed)
	}
	c.armed.Store(true)
	return nil
}

func (c *cq) Poll(wcs []verbs.WorkCompletion) (int, error) {
	if c.n.Load() == 0 {
		if c.overrun.Load() {
			return 0, c.overrunErr()
		}
		return 0, nil
	}
	c.mu.Lock()
	n := min(int(c.n.Load()), len(wcs))
	for i := 0; i < n; i++ {
		wcs[i] = c.ring[c.head]
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.n.Add(int32(-n))
	c.mu.Unlock()
	return n, nil
}

func (c *cq) overrunErr() error {
	return fmt.Errorf("soft: CQ of %d entries overran: completions were lost (size the CQ for every outstanding work request): %w", c.Cap(), verbs.ErrQueueFull)
}

// push adds a completion. A full queue records an overrun (hardware raises a CQ error
// event), which Poll reports once the queue is drained.
func (c *cq) push(wc verbs.WorkCompletion) {
	c.mu.Lock()
	n := int(c.n.Load())
	if n == len(c.ring) {
		c.overrun.Store(true)
		c.mu.Unlock()
		return
	}
	i := c.head + n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = wc
	c.n.Add(1)
	fire := c.armed.Swap(false)
	if fire && c.handler.Load() != nil && c.owe() {
		fire = false
	}
	c.mu.Unlock()
	if fire {
		c.signal()
	}
}

// owe sets owedBit while a reader is deferring, and reports whether it did. mu is held.
func (c *cq) owe() bool {
	for {
		v := c.defers.Load()
		if v&^owedBit == 0 {
			return false
		}
		if c.defers.CompareAndSwap(v, v|owedBit) {
			return true
		}
	}
}

func (c *cq) use() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("soft: CQ: %w", verbs.ErrClosed)
	}
	c.users++
	return nil
}

func (c *cq) unuse() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
}

func (c *cq) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return fmt.Errorf("soft: destroy CQ: %w", verbs.ErrClosed)
	}
	if c.users > 0 {
		return fmt.Errorf("soft: destroy CQ: %d QPs still use it: %w", c.users, verbs.ErrBusy)
	}
	c.closed.Store(true)
	c.dev.unuse()
	return nil
}
