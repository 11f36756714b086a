package mwnet

import (
	"context"
	"os"
	"sync"
	"time"
)

// deadline is one direction's deadline as a context: Read or Write waits on the context
// current when it starts, and SetDeadline cancels that context when the time comes (now,
// for a time in the past), so that a call already waiting ends too, as net.Conn asks.
type deadline struct {
	base   context.Context // canceled by Close: every call ends
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
}

func newDeadline(base context.Context) *deadline {
	d := &deadline{base: base}
	d.ctx, d.cancel = context.WithCancelCause(base)
	return d
}

// current returns the context a call starting now waits on.
func (d *deadline) current() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ctx
}

// set moves the deadline to t; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if d.ctx.Err() != nil && d.base.Err() == nil { // passed: a new deadline starts afresh
		d.ctx, d.cancel = context.WithCancelCause(d.base)
	}
	if t.IsZero() {
		return
	}
	cancel := d.cancel
	if wait := time.Until(t); wait > 0 {
		d.timer = time.AfterFunc(wait, func() { cancel(os.ErrDeadlineExceeded) })
		return
	}
	cancel(os.ErrDeadlineExceeded)
}

// stop ends the timer (Close).
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
}
