package transport

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// cqDepth is the default completion queue size of a poller (Config.CQDepth), or the
// device's largest (MaxCQE) when that is smaller: Soft-RoCE allows 32767.
const cqDepth = 1 << 16

// poller reaps one completion queue, shared by the connections assigned to it, on a
// goroutine of its own (locked to its OS thread only while it spins). It runs application code only where a handler is
// run inline: a method whose recent runs were all short (Config.InlineBudget, on by
// default), or every handler with Config.InlineHandlers; everything else goes to the
// handler pool.
type poller struct {
	t  *Transport
	cq verbs.CQ

	conns connTable // by Conn.id, in the work request ids; written under mu
	byQPN connTable // the same, by QP number: whose a shared receive is

	// Shared receives (Config.SharedReceives): one SRQ and its slots for every connection
	// of the poller. A slot is the queue's while posted, then its message's holder's (a
	// handler, a Response) until released; after close, released slots go to the pool.
	srq          verbs.SRQ
	shared       []recvSlot
	sharedMu     sync.RWMutex // read: a slot taken or released (its holder's alone); write: closing
	sharedHeld   atomic.Int32 // shared slots held by their messages (sharedCrowded)
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
	stopped bool // the poller goroutine has returned: whoever takes active after it finds this

	// lendable (active's holder's) is set while the reaper dispatches the last completion
	// of a batch: a handler may run inline there with the queue lent (runInline), since
	// nothing of the batch is left to dispatch after it.
	lendable bool
	lent     atomic.Bool // a handler runs inline, the queue lent: a NIC goroutine reaps it all
	missed   atomic.Bool // a reapInline found active held (runInline reaps for it once it lets go)
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
		return nil, fmt.Errorf("mwrpc: poller %d: %w", i, err)
	}
	p := &poller{t: t, cq: cq, wake: make(chan struct{}, 1), quit: make(chan struct{}), wcs: make([]verbs.WorkCompletion, 64)}
	// Adaptive pollers spin only when asked (SpinTime) and where a core is left over for
	// everything else: a spinning poller keeps its P, so the goroutines it wakes wait for
	// another P to steal them (the queue of a busy connection on many cores), and on a
	// small machine it takes the core the stream readers, handlers and callers need.
	p.spin = t.cfg.PollMode == PollAdaptive && t.cfg.SpinTime > 0 && runtime.GOMAXPROCS(0) >= 2*t.cfg.Pollers+2
	p.byQPN.byQPN = true
	if n := t.cfg.SharedReceives; n > 0 {
		if err := p.openShared(n); err != nil {
			_ = cq.Destroy()
			return nil, fmt.Errorf("mwrpc: poller %d: %w", i, err)
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
//
// Another reapInline that found the token held while this one had it set missed: this one
// reaps again once it let go. The kick alone is not enough then: while a handler runs
// inline on the poller goroutine with the queue lent, the kick waits for the handler, and
// so would the completion.
func (p *poller) reapInline() {
	for p.reapInlineOnce() && p.missed.Swap(false) {
	}
	probe.Mark(probe.ReapDone)
}

// reapInlineOnce is one reapInline; it reports whether it held the token and let it go
// with the queue armed and empty, so that whatever a reapInline that found it held added
// (missed) is its to reap.
func (p *poller) reapInlineOnce() bool {
	if !p.active.TryLock() {
		// Held: by the poller, which the kick makes look again, or by a reaper about to
		// run a handler inline with the queue lent, which looks at missed once it let go
		// (set before trying once more, so that one of the two sees the other).
		p.missed.Store(true)
		if !p.active.TryLock() {
			p.kick()
			return false
		}
		p.missed.Store(false)
	}
	if p.stopped {
		p.active.Unlock()
		return false
	}
	probe.Mark(probe.Reap)
	for round := 0; ; round++ {
		n, err := p.cq.Poll(p.wcs)
		for i := 0; i < n; i++ {
			p.lendable = i == n-1
			p.dispatch(&p.wcs[i])
		}
		p.lendable = false
		if p.stopped { // while a handler ran inline with the queue lent
			p.active.Unlock()
			return false
		}
		// An overrun, or still busy: the poller's, unless it lent us the queue while it
		// runs a handler.
		if err != nil || n > 0 && round > 0 && !p.lent.Load() {
			p.active.Unlock()
			p.kick()
			return false
		}
		if n > 0 {
			continue
		}
		if empty, err := p.arm(true); err != nil {
			break
		} else if empty {
			p.active.Unlock()
			return true
		}
		if p.stopped { // while the handler arm's completion started ran with the queue lent
			p.active.Unlock()
			return false
		}
	}
	p.active.Unlock()
	return false
}

// runInline runs a handler to completion where its request was reaped. As the last of
// its batch, the queue is lent while the handler runs: armed, and the token let go, so
// that a NIC goroutine that adds a completion reaps it (verbs.DirectCQ) and a handler
// slower than its record holds up no other connection. The reaper takes the token back
// after (and, on a NIC goroutine, stops if the poller stopped meanwhile).
func (p *poller) runInline(sc *serverCall) {
	if !p.lendable {
		sc.run()
		return
	}
	p.lendable = false
	p.lent.Store(true)
	// Armed, the queue tells only of completions added after: one that came since the
	// batch's Poll would wait for the handler. arm dispatches it (to the handler pool: not
	// lendable) until the queue is empty and armed.
	for {
		if empty, err := p.arm(false); err != nil || empty {
			break
		}
	}
	p.active.Unlock()
	// A completion added between arming and the Unlock had its reapInline find the token
	// held: it is reaped now, on a goroutine of its own, as the NIC's would have.
	if p.missed.Swap(false) {
		go p.reapInline()
	}
	sc.run()
	p.active.Lock()
	p.lent.Store(false)
}

// arm arms the queue and reports whether it is still empty: the poll after arming catches
// a completion that came just before (it is dispatched, and the queue must be armed again).
// That completion is a batch of its own: with lend, a handler it starts may run inline
// with the queue lent (runInline), as the last of a batch would. Without (runInline's own
// arming, while the queue is lent already), it may not: a handler run inline then would
// hold the token, and every completion behind it would wait for the handler.
func (p *poller) arm(lend bool) (empty bool, err error) {
	if err := p.cq.ReqNotify(); err != nil {
		return false, err
	}
	if n, _ := p.cq.Poll(p.wcs[:1]); n == 1 {
		p.lendable = lend
		p.dispatch(&p.wcs[0])
		p.lendable = false
		return false, nil
	}
	return true, nil
}

// unusedID returns the first id from next that no connection of the poller has, nor the
// shared receives (sharedConnID). Ids have 24 bits (a work request id's share), so after
// 16 Mi connections the count comes round to those of connections still open, whose
// completions must not go to a newcomer.
func (p *poller) unusedID(next func() uint32) uint32 {
	for {
		if id := next(); id != sharedConnID && p.conns.get(id) == nil {
			return id
		}
	}
}

// add makes c's completions reach it: O(1) amortized, the lookups never locked.
func (p *poller) add(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns.add(c)
	p.byQPN.add(c)
}

// remove makes c's completions, from now on, those of a connection torn down.
func (p *poller) remove(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns.remove(c) {
		p.byQPN.remove(c)
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
			for c := range p.conns.all() {
				c.fail(err)
			}
		}
		for i := 0; i < n; i++ {
			p.lendable = i == n-1
			p.dispatch(&p.wcs[i])
		}
		p.lendable = false
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
		if p.keepSpinning(&idleSince) {
			continue
		}
		// Park until a completion, a kick, the lease timer or quit.
		if empty, err := p.arm(true); err != nil || !empty {
			continue
		}
		p.park(timer, &locked)
		idleSince = time.Time{}
	}
}

// keepSpinning reports whether an idle poller polls again rather than parking: always with
// PollBusy, and with PollAdaptive (where spinning pays, p.spin) for SpinTime after it went
// idle, which it records in idleSince.
func (p *poller) keepSpinning(idleSince *time.Time) bool {
	cfg := &p.t.cfg
	switch cfg.PollMode {
	case PollBusy:
		return true
	case PollAdaptive:
		if !p.spin {
			return false
		}
		if idleSince.IsZero() {
			*idleSince = time.Now()
			return true
		}
		return time.Since(*idleSince) < cfg.SpinTime
	}
	return false
}

// park sleeps, its OS thread and p.active let go of, until a completion, a kick, the
// lease timer or quit; p.active is held again when it returns.
func (p *poller) park(timer *time.Timer, locked *bool) {
	timer.Reset(p.t.tick)
	if *locked {
		runtime.UnlockOSThread()
		*locked = false
	}
	p.active.Unlock()
	select {
	case <-p.cq.Notify():
		probe.MarkN(probe.PollerWake, 1)
	case <-p.wake:
		probe.MarkN(probe.PollerWake, 2)
	case <-timer.C:
		probe.MarkN(probe.PollerWake, 3)
	case <-p.quit:
	}
	p.active.Lock()
}

// housekeeping flushes control messages and tears down failed connections. The poller
// calls it holding its token (active), which it lets go while tearing down.
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
	}
	if len(retired) == 0 {
		return
	}
	// Torn down without the token: destroying a QP waits for its reader, which may be a
	// reaper that ran an inline handler with the queue lent and now waits for the token
	// (runInline). The connections are out of the table: a reaper that takes the token
	// meanwhile drops their completions, as the poller would.
	p.active.Unlock()
	for _, c := range retired {
		c.teardown()
	}
	p.active.Lock()
}

func (p *poller) drainRetired() {
	p.housekeeping()
	for c := range p.conns.all() {
		c.fail(errClosed)
	}
	p.housekeeping()
}

// reap reclaims windows whose lease expired (the peer never released them) and closes
// idle connections (Config.IdleTimeout).
func (p *poller) reap(now time.Time) {
	var buf [16]*pool.Window
	idle := p.t.cfg.IdleTimeout
	for c := range p.conns.all() {
		for _, w := range c.win.ws.Expired(now, p.t.cfg.Lease, buf[:0]) {
			c.reclaim(w)
		}
		if idle > 0 && c.accepted && c.ready.Load() {
			c.checkIdle(now, idle)
		}
		if c.accepted && c.ready.Load() && c.keepaliveDue() {
			c.checkKeepalive(now)
		}
		if c.shared() && c.boot == nil && c.ready.Load() && c.qp.State() == verbs.QPStateError {
			// A QP on the SRQ has no receives of its own to flush when it goes to error,
			// so with nothing in flight no completion tells; where the stream is the QP's
			// wire (soft TCP) there is no bootstrap connection to watch either.
			// (IBV_EVENT_QP_LAST_WQE_REACHED is the hardware's signal; the verbs model
			// leaves it out.)
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
		c = p.byQPN.get(wc.QPNum)
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
		c = p.conns.get(id)
	}
	if c == nil {
		return // a completion of a connection already torn down
	}
	if wc.Status != verbs.WCSuccess {
		switch {
		case wc.Status == verbs.WCWRFlushErr:
			c.fail(fmt.Errorf("%w (a %v flushed first)", errFlushed, wrKindName(kind)))
		case c.peerLeft():
			c.fail(fmt.Errorf("%w (a %v in flight completed with %v)", errPeerLeft, wrKindName(kind), wc.Status))
		default:
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
	case wrWrite:
		c.onWriteDone(idx)
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
	case wrWrite:
		return "RDMA_WRITE"
	case wrPush:
		return "RDMA_WRITE (a written request)"
	}
	return fmt.Sprintf("wr kind %d", k)
}
