package transport

import (
	"context"
	"errors"
	"fmt"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// windowRing is the connection's type-2 memory windows, which expose its large messages
// to the peer. A large message is bound to the next free window over exactly its bytes and
// announced in a SEND posted right after the bind. The window and the buffer under it
// belong to the binding until the peer revokes it with SEND_WITH_INV after its READ
// (invalidated), or the lease runs out and reclaim's LOCAL_INV does; then the buffer goes
// back to the pool.
//
// Lock rules: ws is set at setup and synchronizes itself (pool.Windows); reclaims is
// guarded by Conn.mu. A sender that finds every window exposed waits on Conn.changed;
// invalidated wakes it. Teardown releases the buffers of windows still bound (Conn.torn,
// under Conn.mu, decides between a failed sender and teardown).
type windowRing struct {
	ws       *pool.Windows
	reclaims map[int]*pool.Window // LOCAL_INVs in flight, by window index; nil until one is
	// pushSGE holds, by window index, the source of a written request's WRITE from the
	// buffer bound in that window (pushed.go): it lives as long as the binding, without an
	// allocation per call. Made on first use; the window's binder alone touches its entry.
	pushSGE []verbs.SGE
}

// sendLarge exposes buf (n bytes) through the next window and announces it. The window
// (and buf) belong to the binding from then on, until the peer or a LOCAL_INV revokes it.
func (c *Conn) sendLarge(ctx context.Context, h *wire.Header, buf *pool.Buf, rv revoke, mode sendMode) error {
	var w *pool.Window
	var err error
	if mode == sendReserved { // an inline handler's: the reaper may not wait for a window
		if w, err = c.win.ws.Next(); errors.Is(err, pool.ErrWindowsExhausted) {
			hc := *h
			go func() { _ = c.sendLarge(ctx, &hc, buf, rv, sendReservedAway) }()
			return nil
		}
	} else {
		w, err = c.nextWindow(ctx)
	}
	if err != nil {
		buf.Release()
		return err
	}
	if h.Kind == wire.KindRequest && h.Flags&wire.FlagStream == 0 && c.t.writable {
		if g, ok := c.takePeerGrant(buf.Len()); ok {
			return c.sendPushed(ctx, h, buf, g, w)
		}
	}
	access := verbs.AccessRemoteRead
	if h.Kind == wire.KindRequest && h.Flags&wire.FlagStream == 0 && c.t.writable {
		access |= verbs.AccessRemoteWrite // the response may be written into it (written.go)
		h.Flags |= wire.FlagWritable
	}
	bind, err := c.win.ws.BindBufWR(w, buf, access, wrid(wrBind, c.id, w.Index()))
	if err != nil { // the binding was not recorded: buf is still ours
		_ = c.win.ws.Cancel(w)
		buf.Release()
		return fmt.Errorf("mwrpc: %w", err)
	}
	h.Flags, h.Len, h.RKey, h.Addr = h.Flags|wire.FlagLarge, uint32(buf.Len()), w.RKey(), buf.Addr()
	probe.Mark(probe.Bind)
	// The lease starts when the announcement is posted, not now: send may wait for a
	// credit longer than the lease, and the peer may READ the window until half a lease
	// after the announcement reaches it (see send), so a lease counted from here would
	// reclaim the window under the peer's READ (REM_ACCESS_ERR there).
	rkey := w.RKey()
	c.win.ws.Hold(w)
	pre := [1]verbs.SendWR{bind}
	posted, err := c.send(ctx, h, nil, pre[:], rv, mode)
	if posted {
		c.win.ws.Announced(w, rkey)
		c.t.counters.bound.Add(1)
	}
	if !posted {
		// The binding records buf: either we take it back here or teardown releases it
		// with the window, never both (c.mu and torn decide).
		c.mu.Lock()
		if !c.torn.Load() {
			_ = c.win.ws.Cancel(w)
			buf.Release()
		}
		c.mu.Unlock()
	}
	return err
}

// nextWindow returns a free window, waiting while all are exposed.
func (c *Conn) nextWindow(ctx context.Context) (*pool.Window, error) {
	for {
		w, err := c.win.ws.Next()
		if err == nil {
			return w, nil
		}
		if !errors.Is(err, pool.ErrWindowsExhausted) {
			return nil, fmt.Errorf("mwrpc: %w", err)
		}
		c.mu.Lock()
		// Again under c.mu: a window freed since is found here, or its invalidation wakes
		// us (invalidated takes c.mu after freeing it).
		if w, err = c.win.ws.Next(); err == nil {
			c.mu.Unlock()
			return w, nil
		}
		if c.err == nil {
			err = c.waitLocked(ctx)
		} else {
			err = c.err
		}
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

// invalidated handles the revocation of one of our windows (by the peer's SEND_WITH_INV
// or our LOCAL_INV): the buffer it exposed returns to the pool.
func (c *Conn) invalidated(rkey uint32) {
	if b, ok := c.revoked(rkey); ok && b.Buf != nil {
		b.Buf.Release()
	}
}

// revoked records the revocation of one of our windows and returns what it exposed, whose
// buffer is the caller's now; a revocation of a window the peer was not given fails the
// connection (ok false).
func (c *Conn) revoked(rkey uint32) (pool.Binding, bool) {
	b, err := c.win.ws.Invalidated(rkey)
	if err != nil {
		c.fail(fmt.Errorf("%w: it revoked window 0x%x, which it was not given: %w", ErrProtocol, rkey, err))
		return pool.Binding{}, false
	}
	c.mu.Lock()
	if c.grant.out == rkey {
		c.endGrantLocked()
	}
	for i, w := range c.win.reclaims { // a peer's revocation can overtake our LOCAL_INV
		if w.State() != pool.WindowInvalidating {
			delete(c.win.reclaims, i)
		}
	}
	if c.changed.waiters > 0 {
		c.wakeLocked()
	}
	c.mu.Unlock()
	return b, true
}

// reclaim revokes a window the peer did not release in time.
func (c *Conn) reclaim(w *pool.Window) {
	wr, err := c.win.ws.Reclaim(w, wrid(wrInv, c.id, w.Index()))
	if err != nil {
		return // released meanwhile
	}
	c.mu.Lock()
	if c.win.reclaims == nil {
		c.win.reclaims = make(map[int]*pool.Window)
	}
	c.win.reclaims[w.Index()] = w
	c.mu.Unlock()
	wrs := [1]verbs.SendWR{wr}
	if err := c.qp.PostSend(wrs[:]); err != nil {
		c.fail(err)
	}
}

func (c *Conn) onLocalInv(i int) {
	c.mu.Lock()
	w := c.win.reclaims[i]
	delete(c.win.reclaims, i)
	c.mu.Unlock()
	if w != nil {
		c.t.counters.reclaimed.Add(1)
		c.invalidated(w.RKey())
	}
}
