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
	mu      sync.Mutex
	ring    []verbs.WorkCompletion
	head    int
	armed   bool
	overrun atomic.Bool
	users   int // QPs
	closed  bool
	notify  chan struct{}
}

func newCQ(d *Device, n int) *cq {
	return &cq{dev: d, ring: make([]verbs.WorkCompletion, n), notify: make(chan struct{}, 1)}
}

func (c *cq) Cap() int                { return len(c.ring) }
func (c *cq) Notify() <-chan struct{} { return c.notify }

func (c *cq) ReqNotify() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("soft: req notify: %w", verbs.ErrClosed)
	}
	c.armed = true
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
	return fmt.Errorf("soft: CQ of %d entries overran: completions were lost (size the CQ for every outstanding work request): %w", len(c.ring), verbs.ErrQueueFull)
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
	fire := c.armed
	c.armed = false
	c.mu.Unlock()
	if fire {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

func (c *cq) use() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
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
	if c.closed {
		return fmt.Errorf("soft: destroy CQ: %w", verbs.ErrClosed)
	}
	if c.users > 0 {
		return fmt.Errorf("soft: destroy CQ: %d QPs still use it: %w", c.users, verbs.ErrBusy)
	}
	c.closed = true
	c.dev.unuse()
	return nil
}
