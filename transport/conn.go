package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// Work request ids: kind in the top byte, the connection's id, then an index.
const (
	wrRecv uint64 = iota + 1 // index: receive slot
	wrSend                   // index: send slot
	wrRead                   // index: read operation
	wrBind                   // index: window (unsignaled; completes only on error)
	wrInv                    // index: window (LOCAL_INV)
)

func wrid(kind uint64, conn uint32, idx int) uint64 {
	return kind<<56 | uint64(conn&0xffffff)<<32 | uint64(uint32(idx))
}

// Conn is one connection: a queue pair and the roles that share it. Its methods are safe
// for concurrent use. Each role is a type in a file of its own whose doc comment says what
// it owns, for how long, and under which lock:
//
//   - out, the send queue and its credits (sendqueue.go, credits.go): send slots, the
//     peer's receive slots we may use, and what waits for either;
//   - in, the receive side (receive.go): receive slots and the message parser's scratch;
//   - win, the window ring (windows.go): our windows exposing large messages;
//   - rd, the READ slots (reads.go): fetching the peer's large messages;
//   - calls, the call table (calltable.go): this side's calls in flight;
//   - serving, the server-call table (servercalls.go): the peer's calls being served;
//   - changed, the change signal (signal.go) that wakes who waits on any of them.
//
// The poller (poller.go) reaps completions and hands them to the roles; this file has the
// connection's setup, failure and teardown. One mutex, mu, guards the roles' shared state:
// a call takes it a few times, briefly, and never across a post or a wait.
type Conn struct {
	t       *Transport
	p       *poller
	id      uint32 // in its work request ids: the poller's key to it (connTable)
	qp      verbs.QP
	qpn     uint32        // qp.Num(): whose a shared receive is (connTable)
	hot     *hotCounters  // the transport's counters this connection adds to (its stripe)
	stripe  uint32        // hot's index, and where its calls count in Transport.running
	held    heldPoster    // qp, when it can hold an inline handler's response for its reader
	waiter  waitPoster    // qp, when a poster may write a large WRITE itself
	bounder boundedPoster // qp, when a caller may write its large WRITE itself, bounded by its context
	corker  deferPoster   // qp, when a request may wait for the requests of callers about to post (corks.go)
	eager   int           // largest payload sent inside a SEND
	maxSend int           // largest payload sent at all
	maxRecv uint32        // largest payload accepted
	peer    Peer          // set before the connection is published

	mu      sync.Mutex
	out     sendQueue
	in      receiveSide
	win     windowRing
	rd      readSlots
	calls   callTable
	serving serverCalls
	changed changeSignal
	err     error                 // mu; set once: the connection failed or was closed
	failed  atomic.Pointer[error] // err once set, for failure without mu (every call asks)
	torn    atomic.Bool           // set under mu: resources released; holders release their own
	grant   grantState            // mu; written requests (pushed.go)

	ready   atomic.Bool  // the QP reached RTS: sends may be posted
	placed  atomic.Int32 // placesTransfers' answer once ready: 1 yes, -1 no, 0 not asked yet
	readyCh chan struct{}
	tornCh  chan struct{}
	boot    net.Conn // the bootstrap stream, watched (nil where it is the QP's wire)
	cqe     int      // completions committed of the poller's CQ (Transport.mu)
	goAway  sync.Once
	awayCh  chan struct{} // closed when the peer sent GOAWAY
	awayErr error         // why, set before awayCh closes (GoAwayErr)

	// Admission: from when it is published (admitted, Transport.mu) until teardown the
	// connection counts against MaxConns, and against its host's limits when Serve
	// accepted it (host; those are subject to IdleTimeout too).
	admitted bool
	host     *hostState
	accepted bool
	requests atomic.Uint64 // requests dispatched: what IdleTimeout watches
	idle     idleWatch     // the poller's
	corks    corks         // requests held back for callers about to post (corks.go)
	pings    pingWatch     // the keepalive policy's (Config.Keepalive)
}

// idleWatch is the poller's view of a connection's idleness (IdleTimeout).
type idleWatch struct {
	seen  uint64    // requests when last looked at
	since time.Time // when they last changed, or a call was last in the handlers
	away  time.Time // when GOAWAY went out for idleness; zero if it has not
}

func newConn(t *Transport, p *poller, peer wire.Hello) (*Conn, error) {
	cfg := &t.cfg
	id := p.unusedID(func() uint32 { return t.nextConn.Add(1) & 0xffffff })
	c := &Conn{
		t: t, p: p, id: id, stripe: t.counters.nextHot.Add(1) % hotStripes,
		eager:   min(cfg.EagerThreshold, int(peer.SlotSize)-wire.HeaderLen),
		maxSend: min(cfg.MaxMessage, int(peer.MaxMessage)),
		maxRecv: uint32(cfg.MaxMessage),
		out: sendQueue{
			credits:   grantedCredits(cfg, peer),
			avail:     grantedCredits(cfg, peer),
			ctrlAvail: recvCtrlSlots,
		},
		readyCh: make(chan struct{}),
		tornCh:  make(chan struct{}),
		awayCh:  make(chan struct{}),
	}
	c.hot = &t.counters.hot[c.stripe]
	nsend, nread, sendWR, recvWR := queueSizes(cfg, peer)
	var err error
	c.qp, err = t.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq, SRQ: p.srq, Cap: verbs.QPCap{
		MaxSendWR: sendWR, MaxRecvWR: recvWR, MaxSendSGE: 2, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("mwrpc: create QP: %w", err)
	}
	c.qpn = c.qp.Num()
	c.held, _ = c.qp.(heldPoster)
	c.waiter, _ = c.qp.(waitPoster)
	c.bounder, _ = c.qp.(boundedPoster)
	c.corker, _ = c.qp.(deferPoster)
	c.corks.never.Store(c.corker == nil)
	if c.win.ws, err = pool.NewWindows(t.pd, c.qp, cfg.Windows); err != nil {
		c.abort()
		return nil, fmt.Errorf("mwrpc: %w", err)
	}
	if !c.shared() {
		c.in.slots = make([]recvSlot, cfg.Credits+recvCtrlSlots)
	} else if n, ok := c.qp.(verbs.ErrorNotifier); ok {
		// No receives of its own flush when the QP fails: the provider says so instead (a
		// peer gone while nothing was in flight; poller.reap's check is the fallback).
		n.NotifyError(func() {
			if c.ready.Load() {
				c.fail(errFlushed)
			}
		})
	}
	// Send slots and READ slots are made (and a send slot's registered buffer taken) on
	// their first use: an idle connection holds none, a busy one as many as it has had in
	// flight at once.
	c.out.slots = make([]*sendSlot, nsend)
	c.rd.ops = make([]*readOp, nread)
	for i := range c.in.slots {
		if c.in.slots[i].buf, err = t.pool.TryGet(cfg.SlotSize); err != nil {
			c.abort()
			return nil, fmt.Errorf("mwrpc: receive slots: %w", err)
		}
	}
	for i := range c.out.slots {
		c.out.free = append(c.out.free, i)
	}
	for i := range c.rd.ops {
		c.rd.free = append(c.rd.free, i)
	}
	return c, nil
}

// queueSizes returns a connection's send slots, READ slots, and its QP's send and receive
// queue depths. Every work request may complete into the poller's CQ, so sendWR + recvWR
// is what the connection commits of the CQ (poller.committed).
func queueSizes(cfg *Config, peer wire.Hello) (nsend, nread, sendWR, recvWR int) {
	nsend = grantedCredits(cfg, peer) + recvCtrlSlots + 4
	nread = cfg.Credits + recvCtrlSlots
	if cfg.SharedReceives > 0 { // receives come from the poller's SRQ, committed once
		recvWR = 0
	} else {
		recvWR = cfg.Credits + recvCtrlSlots
	}
	// A window's bind and its LOCAL_INV; the READs of the peer's large messages.
	return nsend, nread, nsend + 2*cfg.Windows + nread, recvWR
}

// connect posts the receive slots and connects the QP over nc.
func (c *Conn) connect(ctx context.Context, nc net.Conn) error {
	params := c.t.cfg.Connect
	if err := c.qp.Modify(verbs.QPAttr{State: verbs.QPStateInit, Access: params.Access}); err != nil {
		return fmt.Errorf("mwrpc: %w", err)
	}
	for i := range c.in.slots {
		if err := c.postRecv(i); err != nil {
			return err
		}
	}
	if sq, ok := c.qp.(verbs.StreamQP); !ok || !sq.NeedsStream() {
		// The bootstrap stream is not the QP's wire: it stays open as the liveness signal,
		// and teardown closes it, even one that comes before connect returns.
		c.boot = nc
	}
	c.p.add(c)
	if _, err := cm.Connect(ctx, nc, c.qp, params); err != nil {
		return fmt.Errorf("%w: connect: %w", ErrHandshake, err)
	}
	if c.boot != nil {
		if err := keepAlive(nc, c.t.cfg.PeerTimeout); err != nil {
			return fmt.Errorf("mwrpc: bootstrap connection: %w", err)
		}
	}
	// The peer may have reached RTS first and already sent requests, which arrived in RTR
	// and were dispatched: their responses waited for this.
	c.ready.Store(true)
	close(c.readyCh)
	c.p.markDirty(c)
	return nil
}

// waitReady waits until the QP can send (RTS), the connection fails, or ctx ends.
func (c *Conn) waitReady(ctx context.Context) error {
	select {
	case <-c.readyCh:
		return nil
	case <-c.tornCh:
		return c.failure()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// failure returns why the connection failed, or nil. It takes no lock: every call and
// every pick of a lane asks, and c.mu is the connection's busiest.
func (c *Conn) failure() error {
	if p := c.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail marks the connection failed: calls in flight fail with ErrUnavailable, handlers'
// contexts are canceled, and the poller tears the queue pair down.
func (c *Conn) fail(cause error) {
	// Asked before c.mu is taken: the provider takes its own QP lock.
	if fr, ok := c.qp.(verbs.FaultReporter); ok && !errors.Is(cause, ErrProtocol) {
		if fault := fr.Fault(); fault != nil { // the NIC says why: the peer's doing
			cause = fmt.Errorf("%w: %w", ErrProtocol, fault) // the flush it caused says less
		}
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if errors.Is(cause, ErrUnavailable) {
		c.err = cause
	} else {
		c.err = fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	err := c.err
	c.failed.Store(&err)
	calls := c.calls.drainLocked()
	serving, instreams := c.serving.snapshotLocked()
	c.wakeLocked()
	c.mu.Unlock()
	switch {
	case errors.Is(cause, ErrProtocol):
		// Counted and logged even during setup: a hostile peer need not finish it.
		c.t.counters.events[evProtocol].Add(1)
		if errors.Is(cause, verbs.ErrRemoteAccess) {
			c.t.counters.access.Add(1)
		}
		c.t.events.log(evProtocol, slog.LevelWarn, "mwrpc: connection failed: the peer broke the protocol", "peer", c.peerAddr(), "qp", c.qp.Num(), "err", err)
	case cause != errClosed && c.ready.Load():
		// Nobody else may hear why it ended (a server's side never has a caller to tell,
		// an idle client's neither); a peer that closed its side is the normal end, and
		// so is a flush that its going caused, and an idle connection closed.
		level := slog.LevelWarn
		if errors.Is(cause, errPeerClosed) || errors.Is(cause, errFlushed) || errors.Is(cause, errPeerLeft) || errors.Is(cause, errIdle) {
			level = slog.LevelDebug
		}
		c.t.events.log(evFailed, level, "mwrpc: connection failed", "peer", c.peerAddr(), "qp", c.qp.Num(), "err", err)
	}
	for _, cl := range calls {
		cl.finish(err)
	}
	for _, u := range serving {
		u.ctx.cancelGen(u.gen, context.Canceled)
	}
	for _, st := range instreams {
		st.fail(err)
	}
	c.p.retire(c)
}

// peerAddr is the peer's address for a log line.
func (c *Conn) peerAddr() string {
	if c.peer.Addr == nil {
		return ""
	}
	return c.peer.Addr.String()
}

// errIdle ends a connection Serve accepted that stayed idle past Config.IdleTimeout and
// GOAWAY.
var errIdle = errors.New("idle past Config.IdleTimeout (GOAWAY sent, and the peer held on)")

// checkIdle runs on the poller every tick for a connection Serve accepted: one with no
// request for IdleTimeout gets GOAWAY (a client moves its next calls to a new connection
// and closes this one), and if it is still open and idle min(IdleTimeout, 5s) later, it
// is closed.
func (c *Conn) checkIdle(now time.Time, limit time.Duration) {
	n := c.requests.Load()
	c.mu.Lock()
	busy, dead := c.serving.calls.len() > 0, c.err != nil
	c.mu.Unlock()
	w := &c.idle
	if dead {
		return
	}
	if n != w.seen || busy || w.since.IsZero() {
		w.seen, w.since, w.away = n, now, time.Time{}
		return
	}
	switch {
	case w.away.IsZero() && now.Sub(w.since) >= limit:
		w.away = now
		c.queueCtrl(wire.Header{Kind: wire.KindGoAway}, revoke{})
	case !w.away.IsZero() && now.Sub(w.away) >= min(limit, 5*time.Second):
		c.t.counters.idleClosed.Add(1)
		c.fail(fmt.Errorf("%w: %w", ErrUnavailable, errIdle))
	}
}

// Close closes the connection: calls in flight fail with ErrUnavailable, and the queue
// pair, windows and buffers are released (buffers held by running handlers or unreleased
// Responses when those end). The peer's calls fail too.
func (c *Conn) Close() error {
	c.fail(errClosed)
	<-c.tornCh
	return nil
}

var errClosed = fmt.Errorf("%w: connection closed", ErrUnavailable)

// GoAway tells the peer this side takes no new calls on the connection: calls already
// sent complete, and a caller should send new ones elsewhere (GoingAway on its side).
func (c *Conn) GoAway(ctx context.Context) error {
	h := wire.Header{Kind: wire.KindGoAway}
	_, err := c.send(ctx, &h, nil, nil, revoke{}, sendWait)
	return err
}

// InFlight returns the calls (and pings) waiting for their answer on this connection.
func (c *Conn) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls.lenLocked()
}

// GoingAway is closed when the peer sent GOAWAY.
func (c *Conn) GoingAway() <-chan struct{} { return c.awayCh }

// Done is closed when the connection has failed or been closed and torn down.
func (c *Conn) Done() <-chan struct{} { return c.tornCh }

// Peer returns the other side's address and, with credentials, what the handshake
// established about it.
func (c *Conn) Peer() Peer { return c.peer }

// MaxSend returns the largest payload this side may send on the connection: the smaller
// of both sides' Config.MaxMessage. Larger ones fail with ErrTooLarge.
func (c *Conn) MaxSend() int { return c.maxSend }

// EagerLimit returns the largest payload this side sends inside a SEND; larger ones go
// through a window.
func (c *Conn) EagerLimit() int { return c.eager }

// Err returns why the connection failed, or nil while it works.
func (c *Conn) Err() error { return c.failure() }

// teardown runs on the poller once the connection failed: after the QP is destroyed no
// transfer touches our memory, so every buffer not held by a handler or a Response goes
// back to the pool and every window is deallocated.
func (c *Conn) teardown() {
	_ = c.qp.Destroy()
	if c.boot != nil {
		_ = c.boot.Close() // tells the peer at once; ends watchPeer
	}
	c.releaseAll()
	c.t.forget(c)
	close(c.tornCh)
}

// releaseAll releases what the connection owns. The QP is destroyed (or never connected).
func (c *Conn) releaseAll() {
	c.mu.Lock() // with torn set under the same hold, a failed sendLarge leaves buffers to us
	if c.win.ws != nil {
		// Every bound window, held ones too: a sender between its bind and its
		// announcement's post leaves the buffer to us once torn is set (sendLarge).
		for _, w := range c.win.ws.Bound(nil) {
			if b := w.Binding().Buf; b != nil {
				b.Release()
			}
		}
		for _, w := range c.win.reclaims {
			if b := w.Binding().Buf; b != nil && w.State() == pool.WindowInvalidating {
				b.Release()
			}
		}
		_ = c.win.ws.Close() // reports the windows just released as bound; they are gone now
	}
	c.torn.Store(true)
	c.endGrantLocked() // its buffer went with its window, above
	for i := range c.in.slots {
		if s := &c.in.slots[i]; s.buf != nil && !s.held && !s.posting {
			s.buf.Release()
			s.buf = nil
		}
	}
	var recvs []int // receive slots responses gathered from: let go once c.mu is not held
	for _, s := range c.out.slots {
		if s != nil && s.state.Load() == slotPosted { // else its sender releases it (postedSlot)
			if r := s.release(); r > 0 {
				recvs = append(recvs, r)
			}
		}
	}
	for _, r := range c.rd.ops {
		if r != nil && r.live {
			r.buf.Release()
			r.buf, r.live = nil, false
		}
	}
	c.mu.Unlock()
	c.letGoSlots(recvs...)
}

// keepAlive clears the setup deadlines of the bootstrap stream nc and turns on TCP
// keepalive so that a peer host that stops answering is declared dead within about
// timeout: probes start after half of it, then go every tenth, five of them.
func keepAlive(nc net.Conn, timeout time.Duration) error {
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return err
	}
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok { // TLS: the TCP connection under it
		nc = u.NetConn()
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil // not TCP (a test's pipe): closing it is the only signal
	}
	return tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true,
		Idle: max(timeout/2, time.Second), Interval: max(timeout/10, time.Second), Count: 5})
}

// errPeerClosed ends a connection whose peer closed the bootstrap stream.
var errPeerClosed = errors.New("the peer closed the bootstrap connection (its side of the connection is gone)")

// errFlushed ends a connection whose queue pair went to the error state with work still
// posted: the provider saw the peer's queue pair go (the soft NIC's link went down).
var errFlushed = errors.New("queue pair flushed (the peer is gone)")

// errPeerLeft ends a connection whose queue pair's provider says the peer went away (the
// stream the queue pair runs over ended) while a work request was in flight, which then
// completed with RETRY_EXC_ERR: on a fabric whose stream is the queue pair's wire (soft
// TCP, shm) there is no bootstrap connection whose end would say so first.
var errPeerLeft = errors.New("the peer left (the stream its queue pair ran over ended)")

// peerLeft reports whether the queue pair's provider says its peer went away.
func (c *Conn) peerLeft() bool {
	r, ok := c.qp.(verbs.PeerLeftReporter)
	return ok && r.PeerLeft()
}

// watchPeer reads the bootstrap stream, on which the peer never writes after setup: its
// end (the peer closed the connection, its process exited, keepalive gave up) fails the
// connection, whose QP may have nothing in flight to notice the peer is gone.
func (c *Conn) watchPeer() {
	defer c.t.wg.Done()
	var b [1]byte
	n, err := c.boot.Read(b[:])
	switch {
	case n > 0:
		c.fail(fmt.Errorf("%w: %w: the peer wrote on the bootstrap connection after setup", ErrUnavailable, ErrProtocol))
	case err == io.EOF:
		c.fail(fmt.Errorf("%w: %w", ErrUnavailable, errPeerClosed))
	default:
		c.fail(fmt.Errorf("%w: bootstrap connection: %w", ErrUnavailable, err))
	}
}

// abort releases a connection whose setup failed before the poller knew it.
func (c *Conn) abort() {
	_ = c.qp.Destroy()
	if c.boot != nil {
		_ = c.boot.Close()
	}
	c.releaseAll()
}

// destroy releases a connection that never served (setup failed after the poller knew it).
func (c *Conn) destroy() {
	c.fail(errClosed)
	<-c.tornCh
}
