package transport

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// sendQueue is the connection's outbound side: its send slots, the credits that let it use
// the peer's receive slots, and what waits to go out when a credit or a slot returns (the
// control queue and pending window revocations, see credits.go).
//
// Lock rules: every field is guarded by Conn.mu, except owed, owedCtrl and heldResp
// (atomics: the receive side counts reposted and held slots without the lock) and the
// contents of a slot while its sender is filling it (filling set: the sender's alone until
// it clears it under Conn.mu). A slot's registered buffer is made on first use and lives with the
// connection; teardown releases those no sender is filling.
type sendQueue struct {
	credits   int // the peer's receive slots for counted messages (fixed at setup)
	avail     int // credits we may still use
	ctrlAvail int // control credits: releases we may still send

	slots []*sendSlot // nil entries until first used
	free  []int       // indexes of slots no SEND is using

	pendingInv []pendingInv // peer windows to revoke with our next SEND
	ctrl       []ctrlMsg    // counted messages the poller could not send yet
	dirty      bool         // queued with the poller for flushing
	stalled    bool         // a release found no control credit or send slot

	owed     atomic.Int32 // receive slots reposted and not yet announced
	owedCtrl atomic.Int32 // control slots reposted and not yet announced
	// heldResp counts the Responses callers hold in our receive slots, own or shared:
	// credits the peer gets back only at their Release (Conn.leaveSlot). Beside owed,
	// which the same Release adds to.
	heldResp atomic.Int32
}

// smallSendSlot is the size a send slot starts at (or the eager limit, if smaller): most
// messages are small, and a connection has up to Credits + recvCtrlSlots + 4 slots, which
// at a 64 KiB eager threshold would take 6 MiB each if made full size. A slot grows when a
// message does not fit, and keeps its size.
const smallSendSlot = 4 << 10

type sendSlot struct {
	buf *pool.Buf
	g   gathered        // what the SEND carries behind buf's bytes, if anything
	wrs [3]verbs.SendWR // up to two work requests before the SEND: a bind, a WRITE
	sge [2]verbs.SGE
	// state is slotFilling while a sender writes and posts it (teardown leaves it to the
	// sender), slotDone when its SEND completed meanwhile (the sender frees it), else
	// slotPosted. Set to slotFilling under c.mu; the sender leaves it with a
	// compare-and-swap that takes no lock unless the SEND completed or the connection was
	// torn down meanwhile (postedSlot); onSent's swap to slotDone is under c.mu.
	state atomic.Uint32
}

// The states of a send slot (sendSlot.state).
const (
	slotPosted  = iota // its sender is done with it: free, or its SEND in flight
	slotFilling        // a sender writes and posts it
	slotDone           // its SEND completed while its sender was still filling it
)

type sendMode uint8

const (
	sendWait         sendMode = iota // a counted message: wait for a credit
	sendResponse                     // a response: wait for a credit, at most Config.CreditTimeout
	sendTry                          // a counted message: fail with errNoCredit rather than wait
	sendControl                      // a Release: uses a control slot, never waits
	sendReserved                     // a response on a credit taken before its handler ran (reserveCredit): the reaper's, never waits for a window
	sendReservedAway                 // the same, from a goroutine of its own: may wait for a window
)

// heldPoster is a QP whose stream reader can hold a message until it has delivered the
// frames it read ahead (soft's QP.PostSendHeld). The responses of handlers run where their
// requests were reaped (sendReserved) go this way, so that the responses to the requests
// one read brought in leave in one write, not one write(2) and one wake-up of the
// caller's reader each. A response waits at most for the delivery of the frames that
// read brought in (and the handlers they run inline, which are short: Config.InlineBudget;
// Config.InlineHandlers runs every handler there, and a slow one holds up its connection's
// responses as it holds up its requests).
type heldPoster interface {
	PostSendHeld(wrs []verbs.SendWR) error
}

// waitPoster is a QP whose poster may write what it posts itself, waiting for the socket
// (soft's QP.PostSendWait), rather than leave a large frame to the NIC engine. A
// written response's RDMA WRITE goes this way when its handler runs on a goroutine of its
// own (sendResponse; postsWRITE): it saves the engine's wake-up per large WRITE. Never a
// reaper (an inline handler's response is sendReserved), and never a caller: a write
// waiting for a peer that stopped reading (a partition) would hold the caller past its
// deadline (the fault suite's partition row: a 2 s call took 8 s); a caller's written
// request is PostSendBounded (boundedPoster). The handler returns once the WRITE is
// written or the connection failed, even if its context ended meanwhile. A
// peer that stops reading holds at most one such handler per connection (the one holding
// the QP's transmit lock; the others leave their frames to it), no longer than the engine
// was held before: its responses run out of credits, which fails the connection after
// Config.CreditTimeout, and the QP's teardown ends the write with a deadline.
type waitPoster interface {
	PostSendWait(wrs []verbs.SendWR) error
}

// boundedPoster is a QP whose caller may write its written request itself, waiting for the
// socket no longer than its context allows (soft's QP.PostSendBounded): the rest is the NIC
// engine's once the context ends, so a partition holds no caller past its deadline. It
// saves the engine's wake-up per large request, as waitPoster does per large response, for
// a caller alone on its connection: where others call too, the engine writes their frames
// back to back, while a caller that held the transmit lock through its write would leave
// theirs to a kick of the engine after it.
type boundedPoster interface {
	PostSendBounded(ctx context.Context, wrs []verbs.SendWR) error
}

// callsWRITE reports whether a message of mode posted behind pre may be posted with
// PostSendBounded: pre ends with a written request's RDMA WRITE, posted by its caller.
func callsWRITE(pre []verbs.SendWR, mode sendMode) bool {
	return mode == sendWait && len(pre) > 0 && pre[len(pre)-1].Opcode == verbs.WRRDMAWrite
}

// postsWRITE reports whether a message of mode posted behind pre may be posted with
// PostSendWait: pre ends with a written response's RDMA WRITE, and mode is a handler's
// on a goroutine of its own.
func postsWRITE(pre []verbs.SendWR, mode sendMode) bool {
	return mode == sendResponse && len(pre) > 0 && pre[len(pre)-1].Opcode == verbs.WRRDMAWrite
}

var errNoCredit = errors.New("mwrpc: no credit")

// errLate: a written response found its caller's window too old to revoke (sendWritten).
var errLate = errors.New("mwrpc: the caller's window is too old to write into")

// errNoSendMemory: the pool had no registered buffer for a send slot.
var errNoSendMemory = errors.New("mwrpc: no registered memory for a send slot")

// canTakeLocked reports whether a message of mode may take a slot now. Conn.mu is held.
func (q *sendQueue) canTakeLocked(mode sendMode) bool {
	if len(q.free) == 0 {
		return false
	}
	switch mode {
	case sendControl: // the last control credit only for returning some
		return q.ctrlAvail > 1 || q.ctrlAvail == 1 && q.owedCtrl.Load() > 0
	case sendReserved, sendReservedAway: // the credit is ours already; a send slot is free while it is
		return true
	default:
		return q.avail > 0
	}
}

// refundLocked gives back slot i and the credit spendLocked took for mode, for a message
// that was not sent after all. Conn.mu is held, since the take.
func (q *sendQueue) refundLocked(i int, mode sendMode) {
	q.free = append(q.free, i)
	switch mode {
	case sendControl:
		q.ctrlAvail++
	case sendReserved, sendReservedAway:
	default:
		q.avail++
	}
}

// spendLocked takes the free slot i (the last of q.free) and the credit mode spends.
// Conn.mu is held.
func (q *sendQueue) spendLocked(mode sendMode) {
	q.free = q.free[:len(q.free)-1]
	switch mode {
	case sendControl:
		q.ctrlAvail--
	case sendReserved, sendReservedAway:
	default:
		q.avail--
	}
}

// send posts one message: h, then payload (copied into a send slot; at most c.eager
// bytes). pre, at most two work requests, are posted just before it (a large message's
// window bind, a written message's WRITE). rv revokes a
// peer window with SEND_WITH_INV; when it has none, a pending revocation rides along. It
// reports whether the message was posted: if not, pre was not either.
func (c *Conn) send(ctx context.Context, h *wire.Header, payload []byte, pre []verbs.SendWR, rv revoke, mode sendMode) (bool, error) {
	return c.sendParts(ctx, h, payload, nil, gathered{}, pre, rv, mode)
}

// sendParts is send with a payload in two parts, head then tail, copied one behind the
// other into the send slot (together at most c.eager bytes): an rpc envelope and the
// caller's body, with no copy to join them first. A part g in registered memory, which
// sendParts owns from here on, follows them without a copy: the SEND gathers it
// (together at most c.eager bytes). A buffer part under gatherBufMin is copied instead,
// as the tail, and released before the SEND is posted.
func (c *Conn) sendParts(ctx context.Context, h *wire.Header, payload, tail []byte, g gathered, pre []verbs.SendWR, rv revoke, mode sendMode) (bool, error) {
	// A small buffer part is copied into the slot as the tail; until then g holds it, and a
	// send that fails first drops it with g.
	small := g.small(tail)
	inSlot := len(payload) + len(tail)
	if small != nil {
		inSlot += small.Len()
	}
	if !c.ready.Load() {
		if mode == sendTry || mode == sendControl {
			g.drop(c)
			return false, errNoCredit // queued; flushed once the connection is ready
		}
		if err := c.waitReady(ctx); err != nil {
			g.drop(c)
			return false, err
		}
	}
	c.mu.Lock()
	i, s, err := c.takeSendLocked(ctx, inSlot, mode)
	if err != nil {
		c.mu.Unlock()
		g.drop(c)
		return false, c.sendFailed(err, mode)
	}
	// A revocation leaves only within half the lease of the window's announcement, judged
	// now, after every wait: later the owner's lease may already have reclaimed it. A
	// response written into that window (sendWritten) must revoke it, so past that time it
	// is not sent at all.
	if rv.rkey != 0 && time.Since(rv.at) >= c.t.cfg.Lease/2 {
		if len(pre) > 0 && pre[len(pre)-1].Opcode == verbs.WRRDMAWrite {
			c.out.refundLocked(i, mode)
			s.state.Store(slotPosted)
			c.mu.Unlock()
			g.drop(c)
			return false, errLate
		}
		rv = revoke{}
	}
	inv := c.stampLocked(h, rv)
	alone := c.loneLocked(true) // see boundedPoster
	n := len(payload) + len(tail) + int(g.sge.Length)
	if n > placeLargeMin {
		c.placeLarge(h.Kind == wire.KindRequest && alone)
	}
	c.mu.Unlock()
	corked := mode == sendWait && h.Kind == wire.KindRequest && len(pre) == 0 && c.corkable(n)

	if small != nil {
		tail, g = small.Bytes(), gathered{}
	}
	wrs := c.fillSlot(i, s, h, payload, tail, g, pre, inv)
	if small != nil {
		small.Release() // copied: back in the pool before its SEND leaves
	}
	if probe.Enabled {
		probe.MarkN(probe.Post, uint32(h.Kind)|uint32(b2u(inv != 0))<<8)
	}
	switch {
	case mode == sendReserved && c.held != nil:
		err = c.held.PostSendHeld(wrs) // an inline handler's response: see heldPoster
	case c.waiter != nil && postsWRITE(pre, mode):
		err = c.waiter.PostSendWait(wrs) // a handler on a goroutine of its own: see waitPoster
	case c.bounder != nil && alone && callsWRITE(pre, mode):
		err = c.bounder.PostSendBounded(ctx, wrs) // a caller's written request: see boundedPoster
	case corked:
		corked, err = c.postCorked(wrs) // a request others woken with it are about to join: see corks
	default:
		err = c.qp.PostSend(wrs)
	}
	probe.Mark(probe.Posted)
	c.postedSlot(i, s)
	if err != nil {
		c.fail(err)
		return false, c.failure()
	}
	if corked {
		c.afterCork()
	}
	return true, nil
}

// takeSendLocked waits for a credit (as mode allows) and a free send slot big enough for
// a payload of n bytes, and takes both: the slot is the caller's (filling) until
// postedSlot. Conn.mu is held, and released while waiting.
func (c *Conn) takeSendLocked(ctx context.Context, n int, mode sendMode) (int, *sendSlot, error) {
	var stall time.Time // when a response gives up waiting for a credit
	for !c.out.canTakeLocked(mode) || c.err != nil {
		if c.err != nil {
			return 0, nil, c.err
		}
		if mode == sendTry || mode == sendControl {
			return 0, nil, errNoCredit
		}
		if mode != sendWait && stall.IsZero() {
			// A handler may not wait forever on a peer that stopped reposting receives:
			// that would hold the handler pool.
			stall = time.Now().Add(c.t.cfg.CreditTimeout)
		}
		if err := c.waitLockedUntil(ctx, stall); err != nil {
			return 0, nil, err
		}
	}
	i := c.out.free[len(c.out.free)-1]
	s, err := c.sizeSlotLocked(i, wire.HeaderLen+n)
	if err != nil {
		return 0, nil, err
	}
	c.out.spendLocked(mode)
	s.state.Store(slotFilling)
	return i, s, nil
}

// sizeSlotLocked returns send slot i with a buffer of at least need bytes, made or grown
// now if it has none that big. Conn.mu is held.
func (c *Conn) sizeSlotLocked(i, need int) (*sendSlot, error) {
	s := c.out.slots[i]
	if s != nil && s.buf != nil && s.buf.Cap() >= need {
		return s, nil
	}
	if s == nil {
		s = new(sendSlot)
		c.out.slots[i] = s
	}
	if s.buf != nil { // too small for this message: a slot grows to what it carries
		s.buf.Release()
	}
	var err error
	if s.buf, err = c.t.pool.TryGet(max(need, min(wire.HeaderLen+c.eager, smallSendSlot))); err != nil {
		return nil, fmt.Errorf("%w: %w", errNoSendMemory, err)
	}
	return s, nil
}

// release gives back the slot's buffers, its own and a gathered one, and returns the
// receive slot + 1 it held (gathered.recv, zero for none), which the caller lets go
// (letGoSlots) once c.mu is no longer held. c.mu is held.
func (s *sendSlot) release() (recv int) {
	if s.buf != nil {
		s.buf.Release()
		s.buf = nil
	}
	return s.letGoGathered()
}

// letGoGathered releases the slot's gathered buffer, if any, and returns the receive slot
// + 1 it held, for the caller to let go outside c.mu. c.mu is held.
func (s *sendSlot) letGoGathered() (recv int) {
	if s.g.buf != nil {
		s.g.buf.Release()
	}
	recv = s.g.recv
	s.g = gathered{}
	return recv
}

// sendFailed turns why a send could not take a slot into its error, failing the connection
// where the peer would otherwise wait forever. Conn.mu is not held.
func (c *Conn) sendFailed(err error, mode sendMode) error {
	switch {
	case err == errStalled: // (not a failure that carries it: that one is counted)
		c.t.counters.events[evStalled].Add(1)
		c.fail(fmt.Errorf("%w: %w: no credit for %v", ErrUnavailable, errStalled, c.t.cfg.CreditTimeout))
		return c.failure()
	case errors.Is(err, errNoSendMemory) && mode != sendWait:
		// A response, a release or a control message that cannot leave would leave the
		// peer waiting: it hears of it as the connection's end.
		c.fail(fmt.Errorf("%w: %w", ErrUnavailable, err))
	}
	return err
}

// stampLocked writes the credits owed to the peer into h and returns the window to revoke
// with this SEND (rv's, which send judged still in time, or a pending one), or 0. Conn.mu
// is held: a release let through on the last control credit carries the control credits
// it was let through for.
func (c *Conn) stampLocked(h *wire.Header, rv revoke) uint32 {
	h.Credits = uint16(c.out.owed.Swap(0))
	h.CtrlCredits = uint8(min(c.out.owedCtrl.Load(), 255))
	c.out.owedCtrl.Add(-int32(h.CtrlCredits))
	inv := rv.rkey
	if inv == 0 {
		inv = c.popInvLocked()
	}
	return inv
}

// fillSlot writes h, payload and tail into send slot i and returns the work requests to
// post: pre, then the SEND (a SEND_WITH_INV when inv is set). The slot is the caller's
// (filling): no lock is needed.
func (c *Conn) fillSlot(i int, s *sendSlot, h *wire.Header, payload, tail []byte, g gathered, pre []verbs.SendWR, inv uint32) []verbs.SendWR {
	gn := int(g.sge.Length)
	if h.Flags&(wire.FlagLarge|wire.FlagWritten|wire.FlagPushed) == 0 && h.Kind != wire.KindGrant {
		h.Len = uint32(len(payload) + len(tail) + gn)
	}
	b := s.buf.Bytes()[:cap(s.buf.Bytes())]
	wire.PutHeader(b, h)
	n := copy(b[wire.HeaderLen:], payload)
	n += copy(b[wire.HeaderLen+n:], tail)
	c.hot.sends.Add(1)
	if n+gn > 0 {
		c.hot.eagerBytes.Add(uint64(n + gn))
	}
	s.sge[0] = verbs.SGE{Addr: s.buf.Addr(), Length: uint32(wire.HeaderLen + n), LKey: s.buf.LKey()}
	s.g = g // owned until the SEND completes, an empty buffer too
	sgl := s.sge[:1]
	if gn > 0 {
		s.sge[1] = g.sge
		sgl = s.sge[:2]
	}
	last := len(s.wrs) - 1
	wr := &s.wrs[last]
	*wr = verbs.SendWR{WRID: wrid(wrSend, c.id, i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: sgl}
	if inv != 0 {
		wr.Opcode, wr.InvalidateRKey = verbs.WRSendWithInv, inv
	}
	first := last - copy(s.wrs[last-len(pre):last], pre)
	return s.wrs[first:]
}

// postedSlot ends the sender's hold on send slot i once its work requests are posted: a
// SEND that completed meanwhile frees the slot now, and a teardown that ran meanwhile left
// its buffer to us. Only those take c.mu: the SEND of a call is acknowledged with its
// response, long after this. A teardown that looks at the slot after the swap releases
// its buffers itself, and the release here under c.mu then finds nothing left.
func (c *Conn) postedSlot(i int, s *sendSlot) {
	done := !s.state.CompareAndSwap(slotFilling, slotPosted)
	if !done && !c.torn.Load() {
		return
	}
	c.mu.Lock()
	flush, recv, torn := false, 0, 0
	if done { // completed already (reaped by a goroutine the queue was lent to): free it now
		s.state.Store(slotPosted)
		flush, recv = c.freeSendLocked(i)
	}
	if c.torn.Load() { // torn down meanwhile: the slot is ours to release
		torn = s.release()
	}
	if flush && !c.out.dirty { // what waited for a free slot is the poller's to send
		c.out.dirty = true
		c.mu.Unlock()
		c.letGoSlots(recv, torn)
		c.p.markDirty(c)
		return
	}
	c.mu.Unlock()
	c.letGoSlots(recv, torn)
}

// popInvLocked takes a pending window revocation that is still safe to send: within half
// the lease of the window's arrival (later, the owner's lease may already have reclaimed
// it, and a second invalidation must never happen). c.mu is held.
func (c *Conn) popInvLocked() uint32 {
	for len(c.out.pendingInv) > 0 {
		p := c.out.pendingInv[len(c.out.pendingInv)-1]
		c.out.pendingInv = c.out.pendingInv[:len(c.out.pendingInv)-1]
		if time.Since(p.since) < c.t.cfg.Lease/2 {
			return p.rkey
		}
	}
	return 0
}

// onSent frees a send slot once its SEND completed; if its sender is still finishing
// with it (the completion can be reaped that soon), the sender frees it.
func (c *Conn) onSent(i int) {
	c.mu.Lock()
	if s := c.out.slots[i]; s != nil && s.state.CompareAndSwap(slotFilling, slotDone) {
		c.mu.Unlock()
		return
	}
	flush, recv := c.freeSendLocked(i)
	c.mu.Unlock()
	c.letGoSlots(recv)
	if flush {
		c.flushCtrl()
	}
}

// freeSendLocked returns send slot i to the free ones and wakes who waits for one; it
// reports whether queued control messages may go now, and returns the receive slot + 1
// the SEND gathered from (zero for none), for the caller to let go once c.mu is no longer
// held (letGoSlots). c.mu is held.
func (c *Conn) freeSendLocked(i int) (flush bool, recv int) {
	if s := c.out.slots[i]; s != nil { // the SEND that gathered from it is done
		recv = s.letGoGathered()
	}
	c.out.free = append(c.out.free, i)
	flush = len(c.out.ctrl) > 0 || c.out.stalled || c.owesCredits() // a free send slot may be what they waited for
	c.out.stalled = false
	if c.changed.waiters > 0 {
		c.wakeLocked()
	}
	return flush, recv
}
