package transport

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// cqDepth is the default completion queue size of a poller (Config.CQDepth), or the
// device's largest (MaxCQE) when that is smaller: Soft-RoCE allows 32767.
const cqDepth = 1 << 16

// poller reaps one completion queue, shared by the connections assigned to it, on a
// goroutine locked to its OS thread. It never runs application code.
type poller struct {
	t  *Transport
	cq verbs.CQ

	conns atomic.Pointer[map[uint32]*Conn] // copy on write
	byQPN atomic.Pointer[map[uint32]*Conn] // the same, by QP number: whose a shared receive is

	// Shared receives (Config.SharedReceives): one SRQ and its slots for every connection
	// of the poller. A slot is the queue's while posted, then its message's holder's (a
	// handler, a Response) until released; after close, released slots go to the pool.
	srq          verbs.SRQ
	shared       []recvSlot
	sharedMu     sync.Mutex
	sharedClosed bool

	mu      sync.Mutex
	retired []*Conn // failed, waiting for teardown
	dirty   []*Conn // control messages or revocations to flush
	spare   []*Conn // the other half of dirty's double buffer
	wake    chan struct{}
	quit    chan struct{}

	wcs       []verbs.WorkCompletion
	spin      bool // adaptive mode spins before parking
	committed int  // CQ entries its connections may fill at once (Transport.mu)

	// active is held by whoever reaps the queue: the poller goroutine while it is not
	// parked, or a provider goroutine that filled the armed queue (verbs.DirectCQ).
	active  sync.Mutex
	stopped bool // the poller goroutine has returned; active is held
}

func newPoller(t *Transport, i int) (*poller, error) {
	depth := cqDepth
	if t.cfg.CQDepth > 0 {
		depth = t.cfg.CQDepth
	}
	if m := t.dev.Attr().MaxCQE; m > 0 && m < depth {
		depth = m
	}
	cq, err := t.dev.CreateCQ(depth)
	if err != nil {
		return nil, fmt.Errorf("transport: poller %d: %w", i, err)
	}
	p := &poller{t: t, cq: cq, wake: make(chan struct{}, 1), quit: make(chan struct{}), wcs: make([]verbs.WorkCompletion, 64)}
	// Adaptive pollers spin only where a core is left over for everything else: on a
	// small machine a spinning poller takes the core the stream readers, handlers and
	// callers need, and keeps the scheduler from polling the network.
	p.spin = t.cfg.PollMode == PollAdaptive && runtime.GOMAXPROCS(0) >= 2*t.cfg.Pollers+2
	m, q := map[uint32]*Conn{}, map[uint32]*Conn{}
	p.conns.Store(&m)
	p.byQPN.Store(&q)
	if n := t.cfg.SharedReceives; n > 0 {
		if err := p.openShared(n); err != nil {
			_ = cq.Destroy()
			return nil, fmt.Errorf("transport: poller %d: %w", i, err)
		}
	}
	if d, ok := cq.(verbs.DirectCQ); ok && t.cfg.PollMode != PollBusy {
		d.SetArmedHandler(p.reapInline)
	}
	return p, nil
}

// reapInline is the armed queue's handler (verbs.DirectCQ): the provider goroutine that
// added a completion while the poller was parked dispatches it, saving the hand-off to the
// poller. It does the poller's work, and so holds the poller's token; if the poller has the
// token (it is awake, or about to park), the poller is kicked so that nothing is left. It
// reaps two batches at most: a busy queue is the poller's, and the goroutine lent to us (a
// stream reader) has its own connection to serve.
func (p *poller) reapInline() {
	if !p.active.TryLock() {
		p.kick()
		return
	}
	if p.stopped {
		p.active.Unlock()
		return
	}
	for round := 0; ; round++ {
		n, err := p.cq.Poll(p.wcs)
		for i := 0; i < n; i++ {
			p.dispatch(&p.wcs[i])
		}
		if err != nil || n > 0 && round > 0 { // an overrun, or still busy: the poller's
			p.active.Unlock()
			p.kick()
			return
		}
		if n > 0 {
			continue
		}
		if empty, err := p.arm(); err != nil || empty {
			break
		}
	}
	p.active.Unlock()
}

// arm arms the queue and reports whether it is still empty: the poll after arming catches
// a completion that came just before (it is dispatched, and the queue must be armed again).
func (p *poller) arm() (empty bool, err error) {
	if err := p.cq.ReqNotify(); err != nil {
		return false, err
	}
	if n, _ := p.cq.Poll(p.wcs[:1]); n == 1 {
		p.dispatch(&p.wcs[0])
		return false, nil
	}
	return true, nil
}

func (p *poller) add(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns.Store(withConn(*p.conns.Load(), c.id, c))
	p.byQPN.Store(withConn(*p.byQPN.Load(), c.qp.Num(), c))
}

func (p *poller) remove(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if (*p.conns.Load())[c.id] != c {
		return
	}
	p.conns.Store(withConn(*p.conns.Load(), c.id, nil))
	p.byQPN.Store(withConn(*p.byQPN.Load(), c.qp.Num(), nil))
}

// withConn returns a copy of m with k mapped to c, or without k if c is nil.
func withConn(m map[uint32]*Conn, k uint32, c *Conn) *map[uint32]*Conn {
	out := make(map[uint32]*Conn, len(m)+1)
	for key, v := range m {
		if key != k {
			out[key] = v
		}
	}
	if c != nil {
		out[k] = c
	}
	return &out
}

// sharedConnID is the connection id in the work request ids of shared receives, which
// belong to the poller (no connection has it).
const sharedConnID = 0

// openShared creates the poller's SRQ and posts n slots to it. Their completions come to
// this poller's CQ: it commits n entries for them.
func (p *poller) openShared(n int) error {
	t := p.t
	srq, err := verbs.CreateSRQ(t.pd, verbs.SRQAttr{MaxWR: n, MaxSGE: 1})
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
		return fmt.Errorf("transport: post shared receive: %w", err)
	}
	return nil
}

// takeShared marks shared slot i taken: its message is being handled.
func (p *poller) takeShared(i int) {
	p.sharedMu.Lock()
	p.shared[i].held = true
	p.sharedMu.Unlock()
}

// dropShared gives back a shared slot whose message the failing connection drops (its own
// slots go with its teardown).
func (c *Conn) dropShared(i int) {
	if c.shared {
		_ = c.p.releaseShared(i)
	}
}

// releaseShared gives shared slot i back to the SRQ, or to the pool once the poller is
// closed.
func (p *poller) releaseShared(i int) error {
	p.sharedMu.Lock()
	defer p.sharedMu.Unlock()
	p.shared[i].held = false
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

// retire queues a failed connection for teardown on the poller goroutine.
func (p *poller) retire(c *Conn) {
	p.mu.Lock()
	p.retired = append(p.retired, c)
	p.mu.Unlock()
	p.kick()
}

// markDirty queues c for flushing its control messages when the poller is next idle.
func (p *poller) markDirty(c *Conn) {
	p.mu.Lock()
	p.dirty = append(p.dirty, c)
	p.mu.Unlock()
	p.kick()
}

func (p *poller) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *poller) stop() { close(p.quit) }

func (p *poller) run() {
	defer p.t.wg.Done()
	// The poller holds its OS thread while it spins, and lets go of it to park: a parked
	// goroutine locked to a thread can only be woken by handing a P to that very thread,
	// two futex round trips that cost more than the whole call on a small machine.
	runtime.LockOSThread()
	locked := true
	defer func() {
		if locked {
			runtime.UnlockOSThread()
		}
	}()
	cfg := &p.t.cfg
	timer := time.NewTimer(p.t.tick)
	defer timer.Stop()
	lastReap := time.Now()
	var idleSince time.Time
	p.active.Lock()
	defer func() {
		p.stopped = true
		p.active.Unlock()
	}()
	for {
		n, err := p.cq.Poll(p.wcs)
		if err != nil { // a CQ overrun loses completions: no connection on it can go on
			for _, c := range *p.conns.Load() {
				c.fail(err)
			}
		}
		for i := 0; i < n; i++ {
			p.dispatch(&p.wcs[i])
		}
		if n > 0 {
			idleSince = time.Time{}
			if !locked {
				runtime.LockOSThread()
				locked = true
			}
			continue
		}
		// Idle: what waited for a quiet moment.
		p.housekeeping()
		if now := time.Now(); now.Sub(lastReap) >= p.t.tick {
			lastReap = now
			p.reap(now)
		}
		select {
		case <-p.quit:
			p.drainRetired()
			return
		default:
		}
		switch cfg.PollMode {
		case PollBusy:
			continue
		case PollAdaptive:
			if !p.spin {
				break
			}
			if idleSince.IsZero() {
				idleSince = time.Now()
				continue
			}
			if time.Since(idleSince) < cfg.SpinTime {
				continue
			}
		}
		// Park until a completion, a kick, the lease timer or quit.
		if empty, err := p.arm(); err != nil || !empty {
			continue
		}
		timer.Reset(p.t.tick)
		if locked {
			runtime.UnlockOSThread()
			locked = false
		}
		p.active.Unlock()
		select {
		case <-p.cq.Notify():
		case <-p.wake:
		case <-timer.C:
		case <-p.quit:
		}
		p.active.Lock()
		idleSince = time.Time{}
	}
}

// housekeeping flushes control messages and tears down failed connections.
func (p *poller) housekeeping() {
	p.mu.Lock()
	dirty, retired := p.dirty, p.retired
	p.dirty, p.spare, p.retired = p.spare[:0], dirty, nil
	p.mu.Unlock()
	for i, c := range dirty {
		c.flushCtrl()
		dirty[i] = nil
	}
	for _, c := range retired {
		p.remove(c)
		c.teardown()
	}
}

func (p *poller) drainRetired() {
	p.housekeeping()
	for _, c := range *p.conns.Load() {
		c.fail(errClosed)
	}
	p.housekeeping()
}

// reap reclaims windows whose lease expired (the peer never released them) and closes
// idle connections (Config.IdleTimeout).
func (p *poller) reap(now time.Time) {
	var buf [16]*pool.Window
	idle := p.t.cfg.IdleTimeout
	for _, c := range *p.conns.Load() {
		for _, w := range c.ws.Expired(now, p.t.cfg.Lease, buf[:0]) {
			c.reclaim(w)
		}
		if idle > 0 && c.accepted && c.ready.Load() {
			c.checkIdle(now, idle)
		}
		if c.shared && c.ready.Load() && c.qp.State() == verbs.QPStateError {
			// A QP on the SRQ has no receives of its own to flush when it goes to error
			// (its peer gone, on a fabric whose stream is the QP's wire): with nothing in
			// flight, no completion would tell. (IBV_EVENT_QP_LAST_WQE_REACHED is the
			// hardware's signal; the verbs model leaves it out.)
			c.fail(errFlushed)
		}
	}
}

func (p *poller) dispatch(wc *verbs.WorkCompletion) {
	if f := p.t.testHookWC.Load(); f != nil {
		(*f)(wc)
	}
	kind, id, idx := wc.WRID>>56, uint32(wc.WRID>>32)&0xffffff, int(uint32(wc.WRID))
	var c *Conn
	if id == sharedConnID && kind == wrRecv { // a shared receive: the QP says whose
		c = (*p.byQPN.Load())[wc.QPNum]
		if c == nil || wc.Status != verbs.WCSuccess {
			// Its connection is gone, or the receive was flushed while being filled: the
			// slot goes back to the queue (and the connection fails below, if any).
			if err := p.releaseShared(idx); err != nil && c != nil {
				c.fail(err)
			}
			if c == nil {
				return
			}
		}
	} else {
		c = (*p.conns.Load())[id]
	}
	if c == nil {
		return // a completion of a connection already torn down
	}
	if wc.Status != verbs.WCSuccess {
		if wc.Status == verbs.WCWRFlushErr {
			c.fail(fmt.Errorf("%w (a %v flushed first)", errFlushed, wrKindName(kind)))
		} else {
			c.fail(fmt.Errorf("%v completed with %v", wrKindName(kind), wc.Status))
		}
		return
	}
	switch kind {
	case wrRecv:
		c.onRecv(idx, wc)
	case wrSend:
		c.onSent(idx)
	case wrRead:
		c.onRead(idx)
	case wrInv:
		c.onLocalInv(idx)
	}
}

func wrKindName(k uint64) string {
	switch k {
	case wrRecv:
		return "RECV"
	case wrSend:
		return "SEND"
	case wrRead:
		return "RDMA_READ"
	case wrBind:
		return "BIND_MW"
	case wrInv:
		return "LOCAL_INV"
	}
	return fmt.Sprintf("wr kind %d", k)
}

// onRecv handles an incoming message in receive slot i.
func (c *Conn) onRecv(i int, wc *verbs.WorkCompletion) {
	s := c.slot(i)
	if c.shared {
		c.p.takeShared(i) // ours until releaseSlot
	}
	h := &c.rxHdr // only the poller receives: a scratch header, so nothing escapes per message
	payload, err := wire.ParseHeader(s.buf.Bytes()[:wc.ByteLen], h, c.maxRecv)
	if err != nil {
		c.fail(fmt.Errorf("%w: it sent a bad message: %w", ErrProtocol, err))
		c.dropShared(i)
		return
	}
	if wc.Flags&verbs.WCWithInv != 0 {
		c.t.counters.revoked.Add(1)
		c.invalidated(wc.InvalidatedRKey)
	}
	counted := h.Kind != wire.KindRelease
	if h.Credits > 0 || h.CtrlCredits > 0 {
		c.mu.Lock()
		c.avail += int(h.Credits)
		c.ctrlAvail += int(h.CtrlCredits)
		if c.avail > c.credits || c.ctrlAvail > recvCtrlSlots {
			c.mu.Unlock()
			c.fail(fmt.Errorf("%w: it sent a bad message: %w: it returned more credits than it was given (%d of %d counted, %d of %d control)",
				ErrProtocol, wire.ErrMalformed, c.avail, c.credits, c.ctrlAvail, recvCtrlSlots))
			c.dropShared(i)
			return
		}
		if c.waiters > 0 {
			c.wakeLocked()
		}
		flush := len(c.ctrl) > 0 || h.CtrlCredits > 0 && (c.stalled || len(c.pendingInv) > 0 || c.owesCredits())
		if h.CtrlCredits > 0 {
			c.stalled = false
		}
		c.mu.Unlock()
		if flush {
			c.flushCtrl()
		}
	}
	if h.Flags&wire.FlagLarge != 0 {
		c.startRead(h)
		c.releaseSlot(i, counted)
		return
	}
	switch h.Kind {
	case wire.KindRequest:
		c.dispatch(h, payload, i, nil, time.Time{})
		return // the slot is the handler's until it returns
	case wire.KindResponse:
		c.deliver(h, payload, i, nil)
		return
	case wire.KindCancel:
		c.mu.Lock()
		var ctx *callCtx
		var gen uint64
		if sc := c.serving[h.CallID]; sc != nil {
			ctx, gen = sc.ctx, sc.ctx.generation()
		}
		c.mu.Unlock()
		if ctx != nil {
			ctx.cancelGen(gen, context.Canceled) // ctx.Err must be exactly Canceled
		}
	case wire.KindPing:
		c.queueCtrl(wire.Header{Kind: wire.KindPong, CallID: h.CallID}, revoke{})
	case wire.KindPong:
		if cl := c.takeCall(h.CallID); cl != nil {
			cl.finish(nil)
		}
	case wire.KindGoAway:
		// Calls already sent complete; the caller's layer stops sending new ones.
		c.goAway.Do(func() { close(c.awayCh) })
	}
	c.releaseSlot(i, counted)
}

// startRead fetches a large message the peer exposed in a window.
func (c *Conn) startRead(h *wire.Header) {
	if f := c.t.testHookLarge.Load(); f != nil {
		(*f)(h)
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
	r.buf, r.h, r.at, r.live = buf, *h, time.Now(), true
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
	c.t.counters.reads.Add(1)
	r := c.reads[i]
	buf, h, at := r.buf, r.h, r.at
	c.t.counters.readBytes.Add(uint64(buf.Len()))
	r.buf, r.live = nil, false
	c.mu.Lock()
	c.freeReads = append(c.freeReads, i)
	c.mu.Unlock()
	if h.Kind == wire.KindRequest {
		c.dispatch(&h, buf.Bytes(), -1, buf, at) // the response revokes the window
		return
	}
	if f := c.t.testHookBeforeRelease.Load(); f != nil {
		(*f)(c)
	}
	c.queueInv(h.RKey, at) // we have the bytes: revoke the window now
	c.deliver(&h, buf.Bytes(), -1, buf)
}

// dispatch hands a request to the handler pool.
// at is when a large request's window was announced.
func (c *Conn) dispatch(h *wire.Header, req []byte, slot int, buf *pool.Buf, at time.Time) {
	sc := serverCallPool.Get().(*serverCall)
	sc.c, sc.id, sc.req, sc.slot, sc.buf = c, h.CallID, req, slot, buf
	if h.Flags&wire.FlagLarge != 0 {
		sc.inv = revoke{h.RKey, at}
	}
	c.mu.Lock()
	if slot >= 0 && !c.shared {
		c.recv[slot].held = true
	}
	c.serving[h.CallID] = sc
	dead := c.err != nil
	// No single connection, nor host, may take more than its share of the handlers.
	crowded := len(c.serving) > c.t.cfg.MaxCallsPerConn
	c.mu.Unlock()
	limit, what := c.t.cfg.MaxCallsPerConn, "on this connection (Config.MaxCallsPerConn"
	// (A limit of the whole pool or more is the pool's to enforce: "overloaded".)
	if sc.host = c.host; sc.host != nil && sc.host.calls.Add(1) > int32(c.t.cfg.MaxCallsPerHost) && c.t.cfg.MaxCallsPerHost < c.t.cfg.Handlers && !crowded {
		crowded, limit, what = true, c.t.cfg.MaxCallsPerHost, "from this host (Config.MaxCallsPerHost"
	}
	if dead { // fail already canceled the calls it knew of: this one starts canceled
		sc.ctx.cancel(context.Canceled)
	}
	c.t.running.Add(1)
	c.t.counters.served.Add(1)
	c.requests.Add(1)
	if crowded {
		c.t.counters.events[evCrowded].Add(1)
		c.t.events.log(evCrowded, slog.LevelWarn, "mwrpc: request refused: too many calls in flight "+what+")", "peer", c.peerAddr(), "max", limit)
		c.queueCtrl(wire.Header{Kind: wire.KindResponse, Status: StatusResourceExhausted, CallID: h.CallID}, sc.inv,
			fmt.Sprintf("mwrpc: too many calls in flight %s is %d)", what, limit))
		sc.w.sent = true
		sc.finish()
		return
	}
	if c.t.cfg.InlineHandlers && !dead && c.reserveCredit() {
		// Run to completion here: no hand-off, and the response cannot wait on anything
		// this goroutine would have to reap (Config.InlineHandlers).
		sc.inline = true
		sc.run()
		return
	}
	if err := c.t.workers.Invoke(sc); err != nil {
		// Overloaded: answer at once, without running anything.
		c.t.counters.events[evOverloaded].Add(1)
		c.t.events.log(evOverloaded, slog.LevelWarn, "mwrpc: request refused: every handler is busy", "peer", c.peerAddr(), "handlers", c.t.cfg.Handlers)
		c.queueCtrl(wire.Header{Kind: wire.KindResponse, Status: StatusResourceExhausted, CallID: h.CallID}, sc.inv,
			fmt.Sprintf("mwrpc: server overloaded: all %d handlers busy", c.t.cfg.Handlers))
		sc.w.sent = true
		sc.finish()
	}
}

// deliver completes the call a response answers.
func (c *Conn) deliver(h *wire.Header, payload []byte, slot int, buf *pool.Buf) {
	cl := c.takeCall(h.CallID)
	if cl == nil { // the caller gave up
		if buf != nil {
			buf.Release()
		} else {
			c.releaseSlot(slot, true)
		}
		return
	}
	if slot >= 0 && !c.shared {
		c.mu.Lock()
		c.recv[slot].held = true
		c.mu.Unlock()
	}
	cl.resp = Response{c: c, cl: cl, status: h.Status, data: payload, slot: slot, buf: buf}
	cl.finish(nil)
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

// onSent frees a send slot once its SEND completed.
func (c *Conn) onSent(i int) {
	c.mu.Lock()
	c.freeSends = append(c.freeSends, i)
	flush := len(c.ctrl) > 0 || c.stalled || c.owesCredits() // a free send slot may be what they waited for
	c.stalled = false
	if c.waiters > 0 {
		c.wakeLocked()
	}
	c.mu.Unlock()
	if flush {
		c.flushCtrl()
	}
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
