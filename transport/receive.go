package transport

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Receive slots. A connection posts Credits + recvCtrlSlots slots of its own, or with
// shared receives takes them from its poller's SRQ. A slot is the NIC's while posted, then
// its message's: a control message's until onRecv is done with it, a request's until its
// handler returns, a response's until the caller releases the Response. releaseSlot
// reposts it and owes the peer the credit; once the connection is torn down its own slots
// go back to the pool instead (a shared one once the poller has closed).

// receiveSide is where the peer's messages land: the connection's own receive slots, or
// with shared receives its poller's (poller.shared), and the header the poller parses
// each message into.
//
// Lock rules: the slots' held and posting flags are guarded by Conn.mu (a shared slot's
// belongs to whoever holds the slot, under poller.sharedMu's read lock, which closing
// takes for writing); a slot's buffer is the NIC's while posted, then its message's holder's
// (see above), and teardown releases only the buffers of slots nobody holds or posts. hdr
// is the poller's alone: only it parses messages, so nothing escapes per message.
type receiveSide struct {
	slots []recvSlot  // nil with shared receives (poller.shared)
	hdr   wire.Header // the poller's scratch
}

type recvSlot struct {
	buf     *pool.Buf
	wr      [1]verbs.RecvWR
	sge     [1]verbs.SGE
	held    bool // c.mu: a handler or a Response reads it
	posting bool // c.mu: releaseSlot is reposting it: teardown leaves the buffer to it
	// sharers counts a held request's holders beyond its handler: a response whose SEND
	// gathers from it (gatherFromRequest). The last one to let go reposts it (letGoSlot).
	sharers atomic.Int32
}

// shared reports whether the connection takes its receives from its poller's SRQ.
func (c *Conn) shared() bool { return c.p.srq != nil }

// slot returns receive slot i: the connection's own, or with shared receives the
// poller's.
func (c *Conn) slot(i int) *recvSlot {
	if c.shared() {
		return &c.p.shared[i]
	}
	return &c.in.slots[i]
}

func (c *Conn) postRecv(i int) error {
	s := &c.in.slots[i]
	s.sge[0] = verbs.SGE{Addr: s.buf.Addr(), Length: uint32(s.buf.Cap()), LKey: s.buf.LKey()}
	s.wr[0] = verbs.RecvWR{WRID: wrid(wrRecv, c.id, i), SGL: s.sge[:]}
	if err := c.qp.PostRecv(s.wr[:]); err != nil {
		return fmt.Errorf("mwrpc: post receive: %w", err)
	}
	return nil
}

// releaseSlot ends a hold on receive slot i: it is posted again, or, if the connection is
// gone, its buffer returns to the pool.
func (c *Conn) releaseSlot(i int, counted bool) {
	if c.shared() {
		if err := c.p.releaseShared(i); err != nil {
			c.fail(err)
			return
		}
		c.owe(counted) // (on a failed connection the Release it may send fails at once)
		return
	}
	c.mu.Lock()
	s := &c.in.slots[i]
	s.held = false
	if c.torn.Load() {
		s.buf.Release()
		s.buf = nil
		c.mu.Unlock()
		return
	}
	if c.err != nil {
		c.mu.Unlock()
		return // teardown releases it
	}
	// Posted outside c.mu; meanwhile the slot is marked, so that a teardown that runs
	// between the check above and the post leaves its buffer to us.
	s.posting = true
	c.mu.Unlock()
	err := c.postRecv(i)
	c.mu.Lock()
	s.posting = false
	if c.torn.Load() { // torn down while we posted: the QP is gone, and the buffer ours
		if !s.held { // (a message that came in it meanwhile: its holder releases it)
			s.buf.Release()
			s.buf = nil
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
		return
	}
	c.owe(counted)
}

// sharedConnID is the connection id in the work request ids of shared receives, which
// belong to the poller (no connection has it).
const sharedConnID = 0

// openShared creates the poller's SRQ and posts n slots to it. Their completions come to
// this poller's CQ: it commits n entries for them.
func (p *poller) openShared(n int) error {
	t := p.t
	srq, err := verbs.CreateSRQ(t.pd, verbs.SRQAttr{MaxWR: n, MaxSGE: 1, AnyOrder: true})
	if err != nil {
		return fmt.Errorf("shared receives: %w", err)
	}
	p.srq, p.shared, p.committed = srq, make([]recvSlot, n), n
	for i := range p.shared {
		if p.shared[i].buf, err = t.pool.TryGet(t.cfg.SlotSize); err != nil {
			p.closeShared()
			return fmt.Errorf("shared receives: %w", err)
		}
		if err := p.postShared(i); err != nil {
			p.closeShared()
			return err
		}
	}
	return nil
}

func (p *poller) postShared(i int) error {
	s := &p.shared[i]
	s.sge[0] = verbs.SGE{Addr: s.buf.Addr(), Length: uint32(s.buf.Cap()), LKey: s.buf.LKey()}
	s.wr[0] = verbs.RecvWR{WRID: wrid(wrRecv, sharedConnID, i), SGL: s.sge[:]}
	if err := p.srq.PostRecv(s.wr[:]); err != nil {
		return fmt.Errorf("mwrpc: post shared receive: %w", err)
	}
	return nil
}

// takeShared marks shared slot i taken: its message is being handled.
func (p *poller) takeShared(i int) {
	p.sharedMu.RLock() // the slot is ours: only closing, which takes the write lock, reads it
	p.shared[i].held = true
	p.sharedMu.RUnlock()
	p.sharedHeld.Add(1)
}

// sharedCrowded reports whether more than half of the shared slots are held: a message
// that would hold its slot longer than onRecv is then copied out (unshare).
func (p *poller) sharedCrowded() bool {
	return int(p.sharedHeld.Load()) > len(p.shared)/2
}

// unshare copies payload, a request's or response's in receive slot i, out to a pool
// buffer and reposts the slot, when the slot would otherwise stay held for as long as a
// handler runs or a caller keeps its Response (leaveSlot says when). It returns nil,
// leaving the slot held, when there is no need or no buffer.
func (c *Conn) unshare(h *wire.Header, payload []byte, i int) *pool.Buf {
	if !c.leaveSlot(h) {
		return nil
	}
	buf, err := c.t.pool.TryGet(max(len(payload), 1))
	if err != nil {
		return nil // held, as without the copy: the pool's exhaustion is its own signal
	}
	buf.SetLen(copy(buf.Bytes(), payload))
	c.t.counters.unshared.Add(1)
	c.releaseSlot(i, true)
	return buf
}

// leaveSlot reports whether a request or response should leave its receive slot rather
// than hold it:
//   - a response while callers hold Responses in half the connection's receive slots:
//     a slot's credit comes back only once it is reposted, and callers that keep their
//     responses until others are answered (a batch read where it landed) would
//     otherwise hold every credit, leaving the peer no way to send the responses they
//     wait for;
//   - with shared receives, any while the shared slots are crowded (a few peers' slow
//     handlers must not empty the queue every connection receives from), and always a
//     stream's opening request (its handler runs for the stream's life).
func (c *Conn) leaveSlot(h *wire.Header) bool {
	if h.Kind == wire.KindResponse && int(c.out.heldResp.Load()) >= c.out.credits/2 && !c.t.testHoldResponses.Load() {
		return true
	}
	return c.shared() && (c.p.sharedCrowded() || h.Flags&wire.FlagStream != 0)
}

// dropShared gives back a shared slot whose message the failing connection drops (its own
// slots go with its teardown).
func (c *Conn) dropShared(i int) {
	if c.shared() {
		_ = c.p.releaseShared(i)
	}
}

// releaseShared gives shared slot i back to the SRQ, or to the pool once the poller is
// closed.
//
// Every message of every connection of the poller comes here: slots are released under
// the read lock, each by its holder alone, so that releases do not queue behind each other
// (a mutex here was 11-13% of the mutex delay at 16 and 64 callers on 2 cores); only
// closeShared takes the write lock, and a release after it finds sharedClosed.
func (p *poller) releaseShared(i int) error {
	p.sharedMu.RLock()
	defer p.sharedMu.RUnlock()
	if p.shared[i].held {
		p.shared[i].held = false
		p.sharedHeld.Add(-1)
	}
	if p.sharedClosed {
		p.shared[i].buf.Release()
		p.shared[i].buf = nil
		return nil
	}
	return p.postShared(i)
}

// closeShared destroys the SRQ (its QPs are gone) and releases the slots it held; slots a
// handler or Response still holds go to the pool when released.
func (p *poller) closeShared() {
	if p.srq == nil {
		return
	}
	p.sharedMu.Lock()
	defer p.sharedMu.Unlock()
	p.sharedClosed = true
	_ = p.srq.Destroy()
	// Which slots are posted is the SRQ's business: a slot is posted unless held, and
	// the held ones are released by their holders (releaseShared, after sharedClosed).
	for i := range p.shared {
		if s := &p.shared[i]; s.buf != nil && !s.held {
			s.buf.Release()
			s.buf = nil
		}
	}
}

// onRecv handles an incoming message in receive slot i.
func (c *Conn) onRecv(i int, wc *verbs.WorkCompletion) {
	s := c.slot(i)
	if c.shared() {
		c.p.takeShared(i) // ours until releaseSlot
	}
	h := &c.in.hdr
	payload, err := wire.ParseHeader(s.buf.Bytes()[:wc.ByteLen], h, c.maxRecv)
	if err != nil {
		c.fail(fmt.Errorf("%w: it sent a bad message: %w", ErrProtocol, err))
		c.dropShared(i)
		return
	}
	if probe.Enabled {
		probe.MarkN(probe.Recv, uint32(h.Kind)|uint32(h.Flags&wire.FlagLarge)<<8)
	}
	if wc.Flags&verbs.WCWithInv != 0 && h.Flags&(wire.FlagWritten|wire.FlagPushed) == 0 { // (a written message's window holds it: onWritten, onPushed)
		c.t.counters.revoked.Add(1)
		c.invalidated(wc.InvalidatedRKey)
	}
	counted := h.Kind != wire.KindRelease
	// A plain request or response returns its credits where it is dispatched or delivered,
	// under that hold of Conn.mu (creditsLocked): one acquisition a message fewer.
	plain := h.Flags&(wire.FlagLarge|wire.FlagWritten|wire.FlagPushed|wire.FlagStream) == 0 &&
		(h.Kind == wire.KindRequest || h.Kind == wire.KindResponse)
	if !plain && (h.Credits > 0 || h.CtrlCredits > 0) && !c.takeCredits(h) {
		c.dropShared(i)
		return
	}
	if h.Kind == wire.KindRequest && h.Flags&wire.FlagStream != 0 && !c.openInStream(h) {
		c.dropShared(i)
		return
	}
	if h.Flags&wire.FlagLarge != 0 {
		c.startRead(h)
		c.releaseSlot(i, counted)
		return
	}
	if h.Flags&wire.FlagWritten != 0 {
		c.onWritten(h, wc)
		c.releaseSlot(i, counted)
		return
	}
	if h.Flags&wire.FlagPushed != 0 {
		c.releaseSlot(i, counted) // the request is in the grant's buffer
		c.onPushed(h, wc)
		return
	}
	switch h.Kind {
	case wire.KindRequest:
		if buf := c.unshare(h, payload, i); buf != nil {
			c.dispatch(h, buf.Bytes(), -1, buf, time.Time{})
			return
		}
		c.dispatch(h, payload, i, nil, time.Time{})
		return // the slot is the handler's until it returns
	case wire.KindResponse:
		if buf := c.unshare(h, payload, i); buf != nil {
			c.deliver(h, buf.Bytes(), -1, buf)
			return
		}
		c.deliver(h, payload, i, nil)
		return
	default:
		c.onControl(h, payload)
	}
	c.releaseSlot(i, counted)
}

// takeCredits adds the credits a message returns to the send queue and sends what waited
// for them; false means the peer returned more than it was given, and the connection
// failed.
func (c *Conn) takeCredits(h *wire.Header) bool {
	c.mu.Lock()
	flush, err := c.creditsLocked(h)
	c.mu.Unlock()
	return c.afterCredits(flush, err)
}

// creditsLocked adds the credits h returns to the send queue, wakes the senders that wait
// for one, and clears them from h, so that they count once whichever of takeCredits,
// deliver and dispatch takes them. It reports whether queued control messages may go now
// (flushCtrl), or the peer's breach of the protocol. Conn.mu is held.
func (c *Conn) creditsLocked(h *wire.Header) (flush bool, err error) {
	if h.Credits == 0 && h.CtrlCredits == 0 {
		return false, nil
	}
	c.out.avail += int(h.Credits)
	c.out.ctrlAvail += int(h.CtrlCredits)
	if c.out.avail > c.out.credits || c.out.ctrlAvail > recvCtrlSlots {
		return false, fmt.Errorf("%w: it sent a bad message: %w: it returned more credits than it was given (%d of %d counted, %d of %d control)",
			ErrProtocol, wire.ErrMalformed, c.out.avail, c.out.credits, c.out.ctrlAvail, recvCtrlSlots)
	}
	if c.changed.waiters > 0 {
		c.wakeLocked()
	}
	flush = len(c.out.ctrl) > 0 || h.CtrlCredits > 0 && (c.out.stalled || len(c.out.pendingInv) > 0 || c.owesCredits())
	if h.CtrlCredits > 0 {
		c.out.stalled = false
	}
	h.Credits, h.CtrlCredits = 0, 0
	return flush, nil
}

// afterCredits does, once Conn.mu is let go, what creditsLocked said: it fails the
// connection on err (and reports false), or sends the control messages that may go.
func (c *Conn) afterCredits(flush bool, err error) bool {
	if err != nil {
		c.fail(err)
		return false
	}
	if flush {
		c.flushCtrl()
	}
	return true
}

// onControl handles a message that carries no request or response: a cancel, a stream's
// message or ack, a ping or pong, GOAWAY (a Release carried only its header's credits).
func (c *Conn) onControl(h *wire.Header, payload []byte) {
	switch h.Kind {
	case wire.KindCancel:
		c.mu.Lock()
		ctx, gen, st := c.serving.cancelTargetLocked(h.CallID)
		c.mu.Unlock()
		if ctx != nil {
			ctx.cancelGen(gen, context.Canceled) // ctx.Err must be exactly Canceled
		}
		if st != nil {
			st.fail(fmt.Errorf("mwrpc: stream canceled by the caller: %w", context.Canceled))
		}
	case wire.KindStreamMsg, wire.KindStreamAck:
		c.onStreamMsg(h, payload)
	case wire.KindPing:
		if c.onPing() {
			c.queueCtrl(wire.Header{Kind: wire.KindPong, CallID: h.CallID}, revoke{})
		}
	case wire.KindPong:
		if cl := c.takeCall(h.CallID); cl != nil {
			cl.finish(nil)
		}
	case wire.KindGrant:
		c.onGrant(h)
	case wire.KindGoAway:
		// Calls already sent complete; the caller's layer stops sending new ones.
		c.onGoAway(h, payload)
	}
}
