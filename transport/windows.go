package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// The window ring and READs. A large message is exposed through the next of the
// connection's type-2 memory windows, bound over exactly its bytes and announced in a
// SEND. The window and the buffer under it belong to the binding until the peer revokes it
// with SEND_WITH_INV after its READ (invalidated), or the lease runs out and reclaim's
// LOCAL_INV does. The receiving side fetches a peer's large message with one RDMA READ into
// a pool buffer (startRead; a READ slot per message in flight, the poller's, made on first
// use), hands it on (onRead) and queues the window's revocation.

type readOp struct {
	buf  *pool.Buf
	st   *Stream // a stream message's stream, and its entry the READ fills
	msg  *streamMsg
	h    wire.Header
	at   time.Time
	wr   [1]verbs.SendWR
	sge  [1]verbs.SGE
	live bool
}

// sendLarge exposes buf (n bytes) through the next window and announces it. The window
// (and buf) belong to the binding from then on, until the peer or a LOCAL_INV revokes it.
func (c *Conn) sendLarge(ctx context.Context, h *wire.Header, buf *pool.Buf, rv revoke, mode sendMode) error {
	var w *pool.Window
	var err error
	if mode == sendReserved { // an inline handler's: the reaper may not wait for a window
		if w, err = c.ws.Next(); errors.Is(err, pool.ErrWindowsExhausted) {
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
	access := verbs.AccessRemoteRead
	if h.Kind == wire.KindRequest && h.Flags&wire.FlagStream == 0 && c.t.writable {
		access |= verbs.AccessRemoteWrite // the response may be written into it (written.go)
		h.Flags |= wire.FlagWritable
	}
	bind, err := c.ws.BindBufWR(w, buf, access, wrid(wrBind, c.id, w.Index()))
	if err != nil { // the binding was not recorded: buf is still ours
		_ = c.ws.Cancel(w)
		buf.Release()
		return fmt.Errorf("transport: %w", err)
	}
	h.Flags, h.Len, h.RKey, h.Addr = h.Flags|wire.FlagLarge, uint32(buf.Len()), w.RKey(), buf.Addr()
	probe.Mark(probe.Bind)
	posted, err := c.send(ctx, h, nil, &bind, rv, mode)
	if posted {
		c.t.counters.bound.Add(1)
	}
	if !posted {
		// The binding records buf: either we take it back here or teardown releases it
		// with the window, never both (c.mu and torn decide).
		c.mu.Lock()
		if !c.torn {
			_ = c.ws.Cancel(w)
			buf.Release()
		}
		c.mu.Unlock()
	}
	return err
}

// nextWindow returns a free window, waiting while all are exposed.
func (c *Conn) nextWindow(ctx context.Context) (*pool.Window, error) {
	for {
		w, err := c.ws.Next()
		if err == nil {
			return w, nil
		}
		if !errors.Is(err, pool.ErrWindowsExhausted) {
			return nil, fmt.Errorf("transport: %w", err)
		}
		c.mu.Lock()
		// Again under c.mu: a window freed since is found here, or its invalidation wakes
		// us (invalidated takes c.mu after freeing it).
		if w, err = c.ws.Next(); err == nil {
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
	b, err := c.ws.Invalidated(rkey)
	if err != nil {
		c.fail(fmt.Errorf("%w: it revoked window 0x%x, which it was not given: %w", ErrProtocol, rkey, err))
		return pool.Binding{}, false
	}
	c.mu.Lock()
	for i, w := range c.reclaims { // a peer's revocation can overtake our LOCAL_INV
		if w.State() != pool.WindowInvalidating {
			delete(c.reclaims, i)
		}
	}
	if c.waiters > 0 {
		c.wakeLocked()
	}
	c.mu.Unlock()
	return b, true
}

// startRead fetches a large message the peer exposed in a window.
func (c *Conn) startRead(h *wire.Header) {
	if f := c.t.testHookLarge.Load(); f != nil {
		(*f)(h)
	}
	var st *Stream
	var msg *streamMsg
	if h.Kind == wire.KindStreamMsg {
		var ok bool
		if st, msg, ok = c.startStreamRead(h); !ok {
			return
		}
	}
	buf, err := c.t.pool.TryGet(int(h.Len))
	c.mu.Lock()
	if err == nil && len(c.freeReads) == 0 {
		err = fmt.Errorf("no read slot")
	}
	if err != nil {
		c.mu.Unlock()
		if buf != nil {
			buf.Release()
		}
		if st != nil {
			c.refuseStreamMsg(st, msg, h, err)
			return
		}
		c.refuseLarge(h, err)
		return
	}
	i := c.freeReads[len(c.freeReads)-1]
	c.freeReads = c.freeReads[:len(c.freeReads)-1]
	c.mu.Unlock()
	r := c.reads[i]
	if r == nil { // only the poller posts READs: no lock needed to make one
		r = new(readOp)
		c.reads[i] = r
	}
	r.buf, r.h, r.at, r.live, r.st, r.msg = buf, *h, time.Now(), true, st, msg
	r.sge[0] = buf.SGE()
	r.wr[0] = verbs.SendWR{WRID: wrid(wrRead, c.id, i), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: r.sge[:], RemoteAddr: h.Addr, RKey: h.RKey}
	// A request can arrive while our QP is still in RTR (the peer reached RTS first), where
	// nothing may be posted: the READ waits for RTS (connect flushes it, via flushCtrl).
	c.mu.Lock()
	if !c.ready.Load() {
		c.unposted = append(c.unposted, i)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	probe.Mark(probe.ReadPost)
	if err := c.qp.PostSend(r.wr[:]); err != nil {
		c.fail(err)
	}
}

// postUnposted posts the READs that arrived before the QP could send.
func (c *Conn) postUnposted() {
	c.mu.Lock()
	reads := c.unposted
	c.unposted = nil
	c.mu.Unlock()
	for _, i := range reads {
		if err := c.qp.PostSend(c.reads[i].wr[:]); err != nil { // made by startRead
			c.fail(err)
			return
		}
	}
}

// refuseLarge answers a large message this side cannot take now (no buffer): a request
// gets StatusResourceExhausted (revoking its window), a response fails its call.
func (c *Conn) refuseLarge(h *wire.Header, why error) {
	if h.Kind == wire.KindRequest {
		if h.Flags&wire.FlagStream != 0 {
			c.dropInStream(h.CallID)
		}
		c.queueCtrl(wire.Header{Kind: wire.KindResponse, Status: StatusResourceExhausted, CallID: h.CallID}, revoke{h.RKey, time.Now()},
			fmt.Sprintf("mwrpc: the server cannot take a request of %d bytes now: %v", h.Len, why))
		return
	}
	c.queueInv(h.RKey, time.Now())
	if cl := c.takeCall(h.CallID); cl != nil {
		cl.finish(fmt.Errorf("transport: response of %d bytes: %w: %w", h.Len, ErrUnavailable, why))
	}
}

// onRead completes the READ of a large message.
func (c *Conn) onRead(i int) {
	probe.Mark(probe.ReadDoneT)
	c.t.counters.reads.Add(1)
	r := c.reads[i]
	buf, h, at, st, msg := r.buf, r.h, r.at, r.st, r.msg
	c.t.counters.readBytes.Add(uint64(buf.Len()))
	r.buf, r.live, r.st, r.msg = nil, false, nil, nil
	c.mu.Lock()
	c.freeReads = append(c.freeReads, i)
	c.mu.Unlock()
	if h.Kind == wire.KindRequest {
		c.dispatch(&h, buf.Bytes(), -1, buf, at) // the response revokes the window
		return
	}
	// We have the bytes: the window is revoked now, but after the bytes are handed on, as
	// queueing the revocation may wake the poller (a futex round trip the caller need not
	// wait for; a request the caller sends meanwhile carries it anyway).
	if st != nil {
		st.fill(msg, buf)
		c.queueInv(h.RKey, at)
		return
	}
	if f := c.t.testHookBeforeRelease.Load(); f != nil {
		(*f)(c)
	}
	c.deliver(&h, buf.Bytes(), -1, buf)
	c.queueInv(h.RKey, at)
}

// reclaim revokes a window the peer did not release in time.
func (c *Conn) reclaim(w *pool.Window) {
	wr, err := c.ws.Reclaim(w, wrid(wrInv, c.id, w.Index()))
	if err != nil {
		return // released meanwhile
	}
	c.mu.Lock()
	if c.reclaims == nil {
		c.reclaims = make(map[int]*pool.Window)
	}
	c.reclaims[w.Index()] = w
	c.mu.Unlock()
	wrs := [1]verbs.SendWR{wr}
	if err := c.qp.PostSend(wrs[:]); err != nil {
		c.fail(err)
	}
}

func (c *Conn) onLocalInv(i int) {
	c.mu.Lock()
	w := c.reclaims[i]
	delete(c.reclaims, i)
	c.mu.Unlock()
	if w != nil {
		c.t.counters.reclaimed.Add(1)
		c.invalidated(w.RKey())
	}
}
