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

// The credit gate. A side sends a counted message only on a credit: one of the receive
// slots the peer posted for it (Config.Credits, the smaller of both sides' offers), given
// back in the header of the peer's messages or in a Release once the peer reposted them.
// send takes a credit and a send slot under c.mu (the slot and its registered buffer are
// made on first use and live with the connection); onSent frees the slot when its SEND
// completes. The poller never waits for a credit: what it must send (pongs, cancels, the
// answers it gives itself, window revocations) is queued and flushed by flushCtrl as
// credits come back, Releases on control credits of their own. A handler's response waits
// at most CreditTimeout, or not at all on a credit reserved before it ran (inline).

// Release messages carry credits and window revocations and consume no credit themselves
// (so that returning credits never needs one): they go to recvCtrlSlots receives of their
// own, posted next to the counted ones, and spend control credits, which the receiver
// returns in header byte 3 once it has reposted those slots. So a release never finds the
// peer without a receive posted (no RNR). A side keeps its last control credit for a
// release that returns control credits: then two sides that owe each other cannot both be
// out of them. A side returns control credits alone once it owes ctrlThreshold of them.
const (
	recvCtrlSlots = 32
	ctrlThreshold = recvCtrlSlots / 2
)

type pendingInv struct {
	rkey  uint32
	since time.Time // when the window's header arrived
}

// ctrlMsg is a counted message the poller queues: a pong, a cancel, an answer it gives
// without a handler (with a short text).
type ctrlMsg struct {
	h   wire.Header
	rv  revoke
	msg []byte
}

// revoke names a peer window a SEND_WITH_INV revokes, and when it was announced: the
// revocation is sent only within half the lease of that (see popInvLocked).
type revoke struct {
	rkey uint32
	at   time.Time
}

// smallSendSlot is the size a send slot starts at (or the eager limit, if smaller): most
// messages are small, and a connection has up to Credits + recvCtrlSlots + 4 slots, which
// at a 64 KiB eager threshold would take 6 MiB each if made full size. A slot grows when a
// message does not fit, and keeps its size.
const smallSendSlot = 4 << 10

type sendSlot struct {
	buf     *pool.Buf
	wrs     [2]verbs.SendWR
	sge     [1]verbs.SGE
	filling bool // c.mu: a sender is writing and posting it; teardown leaves it to the sender
	done    bool // c.mu: its SEND completed while its sender was still filling: the sender frees it
}

// grantedCredits is how many of the peer's receive slots this side uses: what the peer
// offers, but no more than this side's own Credits. The send slots are sized from it, so a
// hello that offers thousands of credits cannot make this side register hundreds of
// megabytes of send slots for one connection (a pool-exhaustion lockout).
func grantedCredits(cfg *Config, peer wire.Hello) int {
	return min(int(peer.Credits), cfg.Credits)
}

// owe counts a receive reposted for the peer, and returns credits when enough are owed.
func (c *Conn) owe(counted bool) {
	if counted && c.owed.Add(1) >= c.creditThreshold() || !counted && c.owedCtrl.Add(1) >= ctrlThreshold {
		c.returnCredits()
	}
}

// creditThreshold is how many reposted slots are worth a Release of their own.
func (c *Conn) creditThreshold() int32 { return int32(max(1, c.t.cfg.Credits/8)) }

// owesCredits reports whether enough reposted slots of either kind wait to be announced
// to be worth a release of their own.
func (c *Conn) owesCredits() bool {
	return c.owed.Load() >= c.creditThreshold() || c.owedCtrl.Load() >= ctrlThreshold
}

// returnCredits announces reposted slots in a Release, which needs no credit.
func (c *Conn) returnCredits() {
	h := wire.Header{Kind: wire.KindRelease}
	_, _ = c.send(context.Background(), &h, nil, nil, revoke{}, sendControl)
}

type sendMode uint8

const (
	sendWait         sendMode = iota // a counted message: wait for a credit
	sendResponse                     // a response: wait for a credit, at most Config.CreditTimeout
	sendTry                          // a counted message: fail with errNoCredit rather than wait
	sendControl                      // a Release: uses a control slot, never waits
	sendReserved                     // a response on a credit taken before its handler ran (reserveCredit): the reaper's, never waits for a window
	sendReservedAway                 // the same, from a goroutine of its own: may wait for a window
)

var errNoCredit = errors.New("transport: no credit")

// errLate: a written response found its caller's window too old to revoke (sendWritten).
var errLate = errors.New("transport: the caller's window is too old to write into")

// send posts one message: h, then payload (copied into a send slot; at most c.eager
// bytes). bind, if set, is posted just before it (a large message's window). rv revokes a
// peer window with SEND_WITH_INV; when it has none, a pending revocation rides along. It
// reports whether the message was posted: if not, bind was not either.
func (c *Conn) send(ctx context.Context, h *wire.Header, payload []byte, bind *verbs.SendWR, rv revoke, mode sendMode) (bool, error) {
	if !c.ready.Load() {
		if mode == sendTry || mode == sendControl {
			return false, errNoCredit // queued; flushed once the connection is ready
		}
		if err := c.waitReady(ctx); err != nil {
			return false, err
		}
	}
	var stall time.Time // when a response gives up waiting for a credit
	// A response written into the caller's window (sendWritten) must revoke it: past the
	// time a revocation may leave (see popInvLocked), it is not sent, and the caller
	// falls back to a window of its own.
	written := bind != nil && bind.Opcode == verbs.WRRDMAWrite
	c.mu.Lock()
	for {
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return false, err
		}
		ok := len(c.freeSends) > 0
		switch mode {
		case sendControl: // the last control credit only for returning some
			ok = ok && (c.ctrlAvail > 1 || c.ctrlAvail == 1 && c.owedCtrl.Load() > 0)
		case sendReserved, sendReservedAway: // the credit is ours already; a send slot is free while it is
		default:
			ok = ok && c.avail > 0
		}
		if ok {
			break
		}
		if mode == sendTry || mode == sendControl {
			c.mu.Unlock()
			return false, errNoCredit
		}
		if mode != sendWait && stall.IsZero() {
			// A handler may not wait forever on a peer that stopped reposting receives:
			// that would hold the handler pool (issue 16's handler starvation).
			stall = time.Now().Add(c.t.cfg.CreditTimeout)
		}
		if err := c.waitLockedUntil(ctx, stall); err != nil {
			c.mu.Unlock()
			if errors.Is(err, errStalled) {
				c.t.counters.events[evStalled].Add(1)
				c.fail(fmt.Errorf("%w: %w: no credit for %v", ErrUnavailable, errStalled, c.t.cfg.CreditTimeout))
				return false, c.failure()
			}
			return false, err
		}
	}
	late := rv.rkey != 0 && time.Since(rv.at) >= c.t.cfg.Lease/2
	if written && (late || rv.rkey == 0) {
		c.mu.Unlock()
		return false, errLate
	}
	i := c.freeSends[len(c.freeSends)-1]
	s := c.sends[i]
	if need := wire.HeaderLen + len(payload); s == nil || s.buf == nil || s.buf.Cap() < need {
		if s == nil {
			s = new(sendSlot)
			c.sends[i] = s
		}
		if s.buf != nil { // too small for this message: a slot grows to what it carries
			s.buf.Release()
		}
		var err error
		if s.buf, err = c.t.pool.TryGet(max(need, min(wire.HeaderLen+c.eager, smallSendSlot))); err != nil {
			c.mu.Unlock()
			err = fmt.Errorf("transport: no registered memory for a send slot: %w", err)
			if mode != sendWait {
				// A response, a release or a control message that cannot leave would
				// leave the peer waiting: it hears of it as the connection's end.
				c.fail(fmt.Errorf("%w: %w", ErrUnavailable, err))
			}
			return false, err
		}
	}
	c.freeSends = c.freeSends[:len(c.freeSends)-1]
	s.filling = true
	switch mode {
	case sendControl:
		c.ctrlAvail--
	case sendReserved, sendReservedAway:
	default:
		c.avail--
	}
	// Taken under mu, so that a release let through on the last control credit carries
	// the control credits it was let through for.
	h.Credits = uint16(c.owed.Swap(0))
	h.CtrlCredits = uint8(min(c.owedCtrl.Load(), 255))
	c.owedCtrl.Add(-int32(h.CtrlCredits))
	// A revocation leaves only within half the lease of the window's announcement, judged
	// now, after every wait: later the owner's lease may already have reclaimed it.
	inv := rv.rkey
	if late {
		inv = 0
	}
	if inv == 0 {
		inv = c.popInvLocked()
	}
	c.mu.Unlock()

	if h.Flags&(wire.FlagLarge|wire.FlagWritten) == 0 {
		h.Len = uint32(len(payload))
	}
	b := s.buf.Bytes()[:cap(s.buf.Bytes())]
	wire.PutHeader(b, h)
	n := copy(b[wire.HeaderLen:], payload)
	if n > 0 {
		c.t.counters.eagerBytes.Add(uint64(n))
	}
	s.sge[0] = verbs.SGE{Addr: s.buf.Addr(), Length: uint32(wire.HeaderLen + n), LKey: s.buf.LKey()}
	wr := &s.wrs[1]
	*wr = verbs.SendWR{WRID: wrid(wrSend, c.id, i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: s.sge[:]}
	if inv != 0 {
		wr.Opcode, wr.InvalidateRKey = verbs.WRSendWithInv, inv
	}
	wrs := s.wrs[1:]
	if bind != nil {
		s.wrs[0] = *bind
		wrs = s.wrs[:]
	}
	if probe.Enabled {
		probe.MarkN(probe.Post, uint32(h.Kind)|uint32(b2u(inv != 0))<<8)
	}
	err := c.qp.PostSend(wrs)
	probe.Mark(probe.Posted)
	c.mu.Lock()
	s.filling = false
	flush := false
	if s.done { // completed already (reaped by a goroutine the queue was lent to): free it now
		s.done = false
		flush = c.freeSendLocked(i)
	}
	if c.torn && s.buf != nil { // torn down meanwhile: the slot is ours to release
		s.buf.Release()
		s.buf = nil
	}
	if flush && !c.dirty { // what waited for a free slot is the poller's to send
		c.dirty = true
		c.mu.Unlock()
		c.p.markDirty(c)
		c.mu.Lock()
	}
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
		return false, c.failure()
	}
	return true, nil
}

// popInvLocked takes a pending window revocation that is still safe to send: within half
// the lease of the window's arrival (later, the owner's lease may already have reclaimed
// it, and a second invalidation must never happen). c.mu is held.
func (c *Conn) popInvLocked() uint32 {
	for len(c.pendingInv) > 0 {
		p := c.pendingInv[len(c.pendingInv)-1]
		c.pendingInv = c.pendingInv[:len(c.pendingInv)-1]
		if time.Since(p.since) < c.t.cfg.Lease/2 {
			return p.rkey
		}
	}
	return 0
}

// waitLocked waits, with c.mu held (and released meanwhile), until something changes.
func (c *Conn) waitLocked(ctx context.Context) error { return c.waitLockedUntil(ctx, time.Time{}) }

// errStalled: the peer returned no credit for Config.CreditTimeout while a response
// waited for one.
var errStalled = errors.New("the peer stopped returning credits (it does not repost its receives)")

// waitLockedUntil is waitLocked that also gives up with errStalled at until, if set (a
// timer only then).
func (c *Conn) waitLockedUntil(ctx context.Context, until time.Time) error {
	if c.wake == nil {
		c.wake = make(chan struct{})
	}
	ch := c.wake
	c.waiters++
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
	c.waiters--
	return err
}

// wakeLocked wakes every waiter. c.mu is held.
func (c *Conn) wakeLocked() {
	if c.wake != nil {
		close(c.wake)
		c.wake = nil
	}
}

// reserveCredit takes a credit for a response ahead of its handler (InlineHandlers): it
// reports whether one was free. The response spends it with sendReserved.
func (c *Conn) reserveCredit() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || !c.ready.Load() || c.avail == 0 {
		return false
	}
	c.avail--
	return true
}

// queueInv records a peer window to revoke: on our next SEND, or alone when the poller is
// next idle.
func (c *Conn) queueInv(rkey uint32, since time.Time) {
	c.mu.Lock()
	c.pendingInv = append(c.pendingInv, pendingInv{rkey: rkey, since: since})
	mark := !c.dirty
	c.dirty = true
	c.mu.Unlock()
	if mark {
		c.p.markDirty(c)
	}
}

// queueCtrl queues a counted message the poller sends when it can (a pong, a cancel, an
// overload answer): the poller never waits for a credit.
func (c *Conn) queueCtrl(h wire.Header, inv revoke, msg ...string) {
	m := ctrlMsg{h: h, rv: inv}
	if len(msg) > 0 {
		m.msg = []byte(msg[0])
	}
	c.mu.Lock()
	c.ctrl = append(c.ctrl, m)
	mark := !c.dirty
	c.dirty = true
	c.mu.Unlock()
	if mark {
		c.p.markDirty(c)
	}
}

// flushCtrl sends what queueCtrl and queueInv queued, as far as credits allow.
func (c *Conn) flushCtrl() {
	probe.Mark(probe.FlushCtrl)
	if c.ready.Load() {
		c.postUnposted()
	}
	for {
		c.mu.Lock()
		c.dirty = false
		if c.err != nil || len(c.ctrl) == 0 {
			c.mu.Unlock()
			break
		}
		m := c.ctrl[0]
		c.mu.Unlock()
		if _, err := c.send(bg, &m.h, m.msg, nil, m.rv, sendTry); err != nil {
			break // no credit: the next credit arrival flushes again; Releases need none
		}
		c.mu.Lock()
		c.ctrl = c.ctrl[1:]
		c.mu.Unlock()
	}
	for {
		c.mu.Lock()
		n := len(c.pendingInv)
		c.mu.Unlock()
		if n == 0 && !c.owesCredits() {
			return
		}
		h := wire.Header{Kind: wire.KindRelease} // carries a revocation and the owed credits
		if _, err := c.send(bg, &h, nil, nil, revoke{}, sendControl); err != nil {
			c.mu.Lock()
			c.stalled = true // no control credit or send slot: their return flushes again
			c.mu.Unlock()
			return
		}
	}
}

// onSent frees a send slot once its SEND completed; if its sender is still finishing
// with it (the completion can be reaped that soon), the sender frees it.
func (c *Conn) onSent(i int) {
	c.mu.Lock()
	if s := c.sends[i]; s != nil && s.filling {
		s.done = true
		c.mu.Unlock()
		return
	}
	flush := c.freeSendLocked(i)
	c.mu.Unlock()
	if flush {
		c.flushCtrl()
	}
}

// freeSendLocked returns send slot i to the free ones and wakes who waits for one; it
// reports whether queued control messages may go now. c.mu is held.
func (c *Conn) freeSendLocked(i int) bool {
	c.freeSends = append(c.freeSends, i)
	flush := len(c.ctrl) > 0 || c.stalled || c.owesCredits() // a free send slot may be what they waited for
	c.stalled = false
	if c.waiters > 0 {
		c.wakeLocked()
	}
	return flush
}
