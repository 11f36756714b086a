package transport

import (
	"context"
	"errors"
	"time"
)

// changeSignal wakes the goroutines that wait on the connection for something to change:
// a credit or a send slot returned, a window freed, the connection failed. It is one
// channel, closed to wake every waiter and made again by the next one, so that a waiter
// costs nothing while nothing waits.
//
// Lock rules: both fields are guarded by Conn.mu; a waiter holds Conn.mu to register and
// re-checks its condition under it after waking.
type changeSignal struct {
	waiters int           // goroutines in waitLockedUntil
	ch      chan struct{} // closed to wake them; nil while nobody waits
}

// waitLocked waits, with c.mu held (and released meanwhile), until something changes.
func (c *Conn) waitLocked(ctx context.Context) error { return c.waitLockedUntil(ctx, time.Time{}) }

// errStalled: the peer returned no credit for Config.CreditTimeout while a response
// waited for one.
var errStalled = errors.New("the peer stopped returning credits (it does not repost its receives)")

// waitLockedUntil is waitLocked that also gives up with errStalled at until, if set (a
// timer only then).
func (c *Conn) waitLockedUntil(ctx context.Context, until time.Time) error {
	if c.changed.ch == nil {
		c.changed.ch = make(chan struct{})
	}
	ch := c.changed.ch
	c.changed.waiters++
	c.mu.Unlock()
	var expired <-chan time.Time
	if !until.IsZero() {
		t := time.NewTimer(time.Until(until))
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
		err = errStalled
	}
	c.mu.Lock()
	c.changed.waiters--
	return err
}

// wakeLocked wakes every waiter. c.mu is held.
func (c *Conn) wakeLocked() {
	if c.changed.ch != nil {
		close(c.changed.ch)
		c.changed.ch = nil
	}
}
