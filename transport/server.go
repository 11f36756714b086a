package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unsafe"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// serverCall is a request being served. It is pooled, and so is its context: both are
// valid until the handler returns.
type serverCall struct {
	c     *Conn
	id    uint64
	req   []byte
	slot  int        // receive slot holding req, or -1
	buf   *pool.Buf  // buffer holding a large req, or nil
	inv   revoke     // the caller's request window, revoked by the response
	dst   writeDst   // that window, when the caller lets the response be written into it
	grant int        // a large request's length: after the response, the caller may be granted memory for the next (pushed.go)
	st    *Stream    // the stream the request opened, or nil
	host  *hostState // counted in its calls (MaxCallsPerHost) until finish, or nil
	// inline: the handler runs on the reaping goroutine (Config.InlineHandlers), and its
	// response spends a credit reserved for it and never waits.
	inline bool
	ctx    *callCtx // kept across reuse: a derived context's timer may still hold it
	w      ResponseWriter
}

var serverCallPool = sync.Pool{New: func() any {
	sc := &serverCall{ctx: new(callCtx)}
	sc.w.sc = sc
	return sc
}}

// runServerCall is the handler pool's function.
func runServerCall(arg any) {
	probe.Mark(probe.Handler)
	arg.(*serverCall).run()
}

func (sc *serverCall) run() {
	c := sc.c
	if h := c.t.handler; h == nil {
		_ = sc.w.Write(StatusUnimplemented, []byte("mwrpc: this side serves no requests"))
	} else {
		sc.serve(h)
	}
	if !sc.w.sent {
		_ = sc.w.Write(StatusOK, nil)
	}
	sc.finish()
}

// serve runs the handler; a panic becomes a StatusInternal response and the server goes on.
func (sc *serverCall) serve(h Handler) {
	defer func() {
		if r := recover(); r != nil {
			if !sc.w.sent {
				_ = sc.w.Write(StatusInternal, fmt.Appendf(nil, "mwrpc: handler panicked: %v", r))
			}
		}
	}()
	h.Serve(sc.ctx, sc.req, &sc.w)
}

// finish releases the request's memory and recycles the call.
func (sc *serverCall) finish() {
	c := sc.c
	c.mu.Lock()
	c.serving.calls.remove(sc)
	c.mu.Unlock()
	if sc.st != nil {
		c.dropInStream(sc.id)
	}
	if sc.host != nil {
		sc.host.calls.Add(-1)
	}
	sc.releaseRequest()
	if sc.w.buf != nil {
		sc.w.buf.Release()
	}
	ctx := sc.ctx
	if !ctx.reset() {
		// A context derived from it (a deadline's timer, a canceling goroutine) may still
		// read it: it stays as it is, and the next call gets a new one.
		ctx = new(callCtx)
	}
	t, stripe := c.t, c.stripe
	sc.recycle(ctx)
	t.running.Done(stripe)
}

// releaseRequest lets go of the memory holding the request: its buffer, or its receive
// slot (and with it the response's SEND, if that gathered from the slot).
func (sc *serverCall) releaseRequest() {
	if sc.buf != nil {
		sc.buf.Release()
	} else if sc.slot >= 0 {
		sc.c.letGoSlot(sc.slot)
	}
}

// recycle clears sc, keeping ctx for its next use, and returns it to the pool.
func (sc *serverCall) recycle(ctx *callCtx) {
	*sc = serverCall{ctx: ctx, w: ResponseWriter{sc: sc}}
	serverCallPool.Put(sc)
}

// ResponseWriter sends a handler's response.
type ResponseWriter struct {
	sc   *serverCall
	buf  *pool.Buf
	sent bool
}

// EagerLimit returns the largest response payload sent inside the SEND; larger ones go
// through a window.
func (w *ResponseWriter) EagerLimit() int { return w.sc.c.eager }

// Peer returns the caller's address and, with credentials, what the handshake established
// about it.
func (w *ResponseWriter) Peer() Peer { return w.sc.c.peer }

// RequestWindowed reports whether the request came through a window (fetched by RDMA
// READ) rather than inside the SEND.
func (w *ResponseWriter) RequestWindowed() bool { return w.sc.buf != nil }

// Buffer returns n bytes of registered memory to build the response in; a response written
// from it (a prefix of it) goes to the caller without a copy. A second call replaces the
// first buffer. The memory is valid until Write or the handler's return.
func (w *ResponseWriter) Buffer(n int) ([]byte, error) {
	if n > w.sc.c.maxSend {
		return nil, fmt.Errorf("mwrpc: response buffer of %d bytes (max %d): %w", n, w.sc.c.maxSend, ErrTooLarge)
	}
	if w.buf != nil {
		w.buf.Release()
		w.buf = nil
	}
	b, err := w.sc.getBuf(w.sc.ctx, n)
	if err != nil {
		return nil, fmt.Errorf("mwrpc: response buffer: %w", err)
	}
	w.buf = b
	return b.Bytes(), nil
}

// CopyIn copies src into dst, memory Buffer returned, as Conn.CopyIn does: split over idle
// cores where the connection's fabric makes that pay.
func (w *ResponseWriter) CopyIn(dst, src []byte) int { return w.sc.c.CopyIn(dst, src) }

// Write sends the response: status, and payload (which may be a prefix of Buffer's memory,
// sent without a copy, or any other bytes, copied once). A large payload that lies in a
// windowed request's memory (RequestWindowed: a handler that answers with its request, or
// a part of it, or builds the answer in its place) leaves from there without a copy too;
// the request's memory is then the response's, and must not be used after Write. One of
// 16 KiB or more up to EagerLimit that lies in the request's memory (an echo) leaves from
// the request's receive slot inside the SEND: the request stays readable until the
// handler returns, but those bytes must not change after Write. Write may be called once;
// a handler that returns without calling it answers StatusOK with no payload.
func (w *ResponseWriter) Write(status Code, payload []byte) error {
	return w.WriteParts(status, payload, nil)
}

// WriteParts is Write with the payload in two parts, head then tail (an rpc envelope and
// the handler's result): up to EagerLimit bytes in all, both are copied straight into the
// send slot, one behind the other, with no copy to join them first, except a tail (or a
// payload without one) that lies in the request's memory, as Write says: the SEND carries
// it from there, and the request's receive slot is posted again once both the handler has
// returned and the SEND has completed. Above EagerLimit, with a tail,
// they are joined on the heap first and sent as Write sends a payload that is not in
// Buffer's or the request's memory.
func (w *ResponseWriter) WriteParts(status Code, head, tail []byte) error {
	probe.Mark(probe.RespWrite)
	if w.sent {
		return errors.New("mwrpc: response already written")
	}
	w.sent = true
	var err error
	if len(tail) > 0 && len(head)+len(tail) > w.sc.c.eager {
		err = w.write(status, append(head[:len(head):len(head)], tail...), nil)
	} else {
		err = w.write(status, head, tail)
	}
	if n := w.sc.grant; n > 0 {
		w.sc.grant = 0
		c := w.sc.c
		if !w.sc.inline {
			c.grantFor(n) // after the response: it overlaps the response's way to the caller
			return err
		}
		// An inline handler runs on the poller, which must not spend a grant's zeroing:
		// counted as a handler, so that Close waits for it.
		c.t.running.Add(c.stripe, 1)
		go func() {
			defer c.t.running.Done(c.stripe)
			c.grantFor(n)
		}()
	}
	return err
}

// write sends the response (Write's work); tail, when set, follows payload inside the
// SEND (together at most the eager threshold).
func (w *ResponseWriter) write(status Code, payload, tail []byte) error {
	sc := w.sc
	c := sc.c
	h := wire.Header{Kind: wire.KindResponse, Status: uint16(status), CallID: sc.id}
	// The response must go out even if the caller gave up: it revokes the caller's
	// request window. Waits end when the connection fails.
	ctx := context.Background()
	mode := sendResponse
	if sc.inline {
		mode = sendReserved
	}
	if len(payload) > c.maxSend {
		h.Status = uint16(StatusResourceExhausted)
		msg := fmt.Appendf(nil, "mwrpc: response of %d bytes exceeds the maximum message size %d", len(payload), c.maxSend)
		_, err := c.send(ctx, &h, msg, nil, sc.inv, mode)
		return errors.Join(fmt.Errorf("mwrpc: response of %d bytes (max %d): %w", len(payload), c.maxSend, ErrTooLarge), err)
	}
	if len(payload)+len(tail) <= c.eager {
		// An echo, or a slice of the request, leaves from the request's receive slot.
		if len(tail) == 0 {
			payload, tail = nil, payload
		}
		g := sc.gatherFromRequest(tail)
		if g.recv > 0 {
			tail = nil
		}
		_, err := c.sendParts(ctx, &h, payload, tail, g, nil, sc.inv, mode)
		return err
	}
	buf := w.buf
	if buf != nil && len(payload) > 0 && unsafe.SliceData(payload) == unsafe.SliceData(buf.Bytes()) && len(payload) <= buf.Cap() {
		w.buf = nil // the binding owns it now
		buf.SetLen(len(payload))
	} else if off, ok := offsetIn(sc.buf, payload); ok {
		buf, sc.buf = sc.buf, nil // the request's memory: the binding owns it now
		buf.Slice(off, len(payload))
	} else {
		var err error
		if buf, err = sc.getBuf(ctx, len(payload)); err != nil {
			// The caller still gets an answer (and its window revoked).
			h.Status = uint16(StatusResourceExhausted)
			msg := fmt.Appendf(nil, "mwrpc: no registered memory for a response of %d bytes: %v", len(payload), err)
			_, serr := c.send(ctx, &h, msg, nil, sc.inv, mode)
			return errors.Join(fmt.Errorf("mwrpc: response buffer: %w", err), serr)
		}
		c.CopyIn(buf.Bytes(), payload)
	}
	if sc.dst.rkey != 0 && buf.Len() <= int(sc.dst.n) {
		return c.sendWritten(ctx, &h, buf, sc.inv, sc.dst, mode)
	}
	return c.sendLarge(ctx, &h, buf, sc.inv, mode)
}

// offsetIn reports where p lies in buf's memory, if all of it does (buf may be nil).
func offsetIn(buf *pool.Buf, p []byte) (int, bool) {
	if buf == nil {
		return 0, false
	}
	return offsetOf(buf.Bytes(), p)
}

// offsetOf reports where p lies in mem, if all of it does.
func offsetOf(mem, p []byte) (int, bool) {
	if len(p) == 0 {
		return 0, false
	}
	start, at := uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	if at < start || at-start > uintptr(len(mem)) || uintptr(len(p)) > uintptr(len(mem))-(at-start) {
		return 0, false
	}
	return int(at - start), true
}

// getBuf takes a registered buffer for the response: waiting for one, or for an inline
// handler (whose goroutine reaps the completions that free them) without waiting.
func (sc *serverCall) getBuf(ctx context.Context, n int) (*pool.Buf, error) {
	if sc.inline {
		return sc.c.t.pool.TryGet(n)
	}
	return sc.c.t.pool.Get(ctx, n)
}

// callCtx is a handler's context: canceled when the caller cancels or the connection
// fails, and at the caller's deadline once WithCallDeadline set it. It is pooled with its
// serverCall and valid until the handler returns.
type callCtx struct {
	mu       sync.Mutex
	gen      uint64 // bumped on reuse: a stale AfterFunc stop then does nothing
	done     chan struct{}
	err      error
	fns      []func()
	derived  bool        // AfterFunc was called: a derived context may use this one after the call
	deadline time.Time   // the caller's (WithCallDeadline), or zero
	timer    *time.Timer // fires at deadline (expire); kept across reuse, reset per call
}

func (x *callCtx) Deadline() (time.Time, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.deadline, !x.deadline.IsZero()
}

func (x *callCtx) Value(any) any { return nil }

// WithCallDeadline bounds ctx by the caller's deadline d. A handler's own context (the one
// the transport passes to Handler.Serve) takes the deadline itself, with a timer it keeps
// from call to call, so that a caller's deadline costs a call no allocation and leaves the
// context reusable; any other context gets context.WithDeadline. cancel, when not nil,
// ends the bound early.
func WithCallDeadline(ctx context.Context, d time.Time) (_ context.Context, cancel context.CancelFunc) {
	if x, ok := ctx.(*callCtx); ok && x.setDeadline(d) {
		return x, nil
	}
	return context.WithDeadline(ctx, d)
}

// setDeadline arms the deadline, unless the context has one already; it reports whether
// it did (a context already canceled takes it, as there is nothing left to bound).
func (x *callCtx) setDeadline(d time.Time) bool {
	x.mu.Lock()
	if !x.deadline.IsZero() {
		x.mu.Unlock()
		return false
	}
	x.deadline = d
	if x.err != nil {
		x.mu.Unlock()
		return true
	}
	wait := time.Until(d)
	if wait <= 0 {
		x.cancelLocked(x.gen, context.DeadlineExceeded)
		return true
	}
	if x.timer == nil {
		x.timer = time.AfterFunc(wait, x.expire)
	} else {
		x.timer.Reset(wait)
	}
	x.mu.Unlock()
	return true
}

// expire is the deadline timer's: it cancels the context if its deadline has passed. A
// timer that fired for an earlier call and ran late finds this call's deadline, which it
// cancels only if that has passed too.
func (x *callCtx) expire() {
	x.mu.Lock()
	if x.deadline.IsZero() || time.Now().Before(x.deadline) {
		x.mu.Unlock()
		return
	}
	x.cancelLocked(x.gen, context.DeadlineExceeded)
}

func (x *callCtx) Done() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done == nil {
		x.done = make(chan struct{})
		if x.err != nil {
			close(x.done)
		}
	}
	return x.done
}

func (x *callCtx) Err() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.err
}

// AfterFunc lets contexts derived from this one (context.WithDeadline and friends) follow
// its cancellation without a goroutine each.
func (x *callCtx) AfterFunc(f func()) func() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.derived = true
	if x.err != nil {
		go f()
		return func() bool { return false }
	}
	i, gen := len(x.fns), x.gen
	x.fns = append(x.fns, f)
	return func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.gen == gen && i < len(x.fns) && x.fns[i] != nil {
			x.fns[i] = nil
			return true
		}
		return false
	}
}

// generation returns the context's current use, for cancelGen.
func (x *callCtx) generation() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.gen
}

// cancelGen cancels the context if it is still in use gen: the call it belonged to may
// have ended, and its context gone to another call, since gen was read. The check and the
// cancel are one hold of the lock.
func (x *callCtx) cancelGen(gen uint64, err error) {
	x.mu.Lock()
	x.cancelLocked(gen, err)
}

func (x *callCtx) cancel(err error) {
	x.mu.Lock()
	x.cancelLocked(x.gen, err)
}

// cancelLocked cancels use gen of the context; x.mu is held and released.
func (x *callCtx) cancelLocked(gen uint64, err error) {
	if x.err != nil || x.gen != gen {
		x.mu.Unlock()
		return
	}
	x.err = err
	if x.done != nil {
		close(x.done)
	}
	fns := x.fns
	x.fns = nil
	x.mu.Unlock()
	// Run here, not each in a goroutine: they are the context package's own cancel
	// functions of contexts derived from this one (context.AfterFunc wraps a user's f in
	// a goroutine itself), so a derived context (the caller's deadline) is canceled by the
	// time this returns, as a handler that checks it after a failed send expects.
	for _, f := range fns {
		if f != nil {
			f()
		}
	}
}

// reset readies the context for another call, unless contexts were derived from it; it
// reports whether it did.
func (x *callCtx) reset() bool {
	x.mu.Lock()
	if x.timer != nil {
		x.timer.Stop()
	}
	x.deadline = time.Time{}
	if x.derived {
		// The contexts derived from it end with the call, as they did when the caller's
		// deadline was a context.WithDeadline of its own that the rpc layer canceled then.
		// It is not reused: they may still read it.
		x.cancelLocked(x.gen, context.Canceled)
		x.mu.Lock()
		x.gen++
		x.mu.Unlock()
		return false
	}
	x.gen++ // stale stops and cancels do nothing from here on
	clear(x.fns)
	x.done, x.err, x.fns = nil, nil, x.fns[:0]
	x.mu.Unlock()
	return true
}

var bg = context.Background()

// InlineAdvisor is implemented by a Handler that can tell which requests are safe to run
// to completion on the poller that reaped them (short handlers that never block): the
// rpc server answers for a method once its recent runs were all short
// (Config.InlineBudget). The poller asks it only where running inline cannot hold up
// other work: on its own goroutine, for the last completion of a batch.
type InlineAdvisor interface {
	InlineOK(req []byte) bool
}

// inlineOK reports whether a request may run where it was reaped: always with
// InlineHandlers, else when the handler's InlineAdvisor says so and the poller's own
// goroutine reaped it as the last of its batch (runInline then lends the queue to the
// NIC's goroutines while the handler runs).
func (c *Conn) inlineOK(req []byte) bool {
	if c.t.cfg.InlineHandlers {
		return true
	}
	return c.t.advisor != nil && c.p.lendable && c.t.advisor.InlineOK(req)
}

// overHost counts a request bound for the handler pool in its host's calls
// (Config.MaxCallsPerHost) until it finishes, and reports whether the host is over its
// share. A request run inline holds no handler and is not counted, nor is any while the
// share is the whole pool (the pool refuses then: "overloaded"): behind a sidecar or a
// NAT every connection comes from one address, and a count that every call wrote twice
// was one cache line all the server's cores shared.
func (c *Conn) overHost(sc *serverCall) bool {
	hs := c.host
	if hs == nil || c.t.cfg.MaxCallsPerHost >= c.t.cfg.Handlers {
		return false
	}
	sc.host = hs
	return hs.calls.Add(1) > int32(c.t.cfg.MaxCallsPerHost)
}

// refuseRequest fails with err the connection whose peer sent sc's request in breach of
// the protocol (an id a call being served has, credits it was never given), and lets go
// of the request's memory.
func (c *Conn) refuseRequest(sc *serverCall, err error) {
	c.fail(err)
	sc.releaseRequest()
	sc.recycle(sc.ctx) // never handed to a handler: its context is as it came from the pool
}

// dispatch hands a request to the handler pool.
// at is when a large request's window was announced.
func (c *Conn) dispatch(h *wire.Header, req []byte, slot int, buf *pool.Buf, at time.Time) {
	sc := serverCallPool.Get().(*serverCall)
	sc.c, sc.id, sc.req, sc.slot, sc.buf = c, h.CallID, req, slot, buf
	if h.Flags&(wire.FlagLarge|wire.FlagPushed) != 0 {
		sc.inv = revoke{h.RKey, at}
		if h.Flags&wire.FlagStream == 0 && c.t.writable {
			sc.grant = int(h.Len) // its response leads to a grant for the next (pushed.go)
		}
	}
	if h.Flags&wire.FlagWritable != 0 {
		sc.dst = writeDst{addr: h.Addr, rkey: h.RKey, n: h.Len}
	}
	c.mu.Lock()
	flush, err := c.creditsLocked(h)
	if err != nil {
		c.mu.Unlock()
		c.refuseRequest(sc, err)
		return
	}
	if c.serving.calls.get(h.CallID) != nil {
		// Two calls under one id: the second would hide the first from the per-connection
		// limit and from cancellation, and the first's end would drop the second.
		c.mu.Unlock()
		c.refuseRequest(sc, fmt.Errorf("%w: it sent a bad message: request %d, whose id a call being served has", ErrProtocol, sc.id))
		return
	}
	if slot >= 0 && !c.shared() {
		c.in.slots[slot].held = true
	}
	c.serving.calls.add(sc)
	if h.Flags&wire.FlagStream != 0 {
		sc.st = c.serving.streams[h.CallID] // recorded when the header arrived (openInStream)
	}
	dead := c.err != nil
	// No single connection, nor host, may take more than its share of the handlers.
	crowded := c.serving.calls.len() > c.t.cfg.MaxCallsPerConn
	c.mu.Unlock()
	c.afterCredits(flush, nil)
	limit, what := c.t.cfg.MaxCallsPerConn, "on this connection (Config.MaxCallsPerConn"
	inline := !crowded && sc.st == nil && !dead && c.inlineOK(req) && c.reserveCredit()
	if !crowded && !inline && c.overHost(sc) {
		crowded, limit, what = true, c.t.cfg.MaxCallsPerHost, "from this host (Config.MaxCallsPerHost"
	}
	if dead { // fail already canceled the calls it knew of: this one starts canceled
		sc.ctx.cancel(context.Canceled)
	}
	c.t.running.Add(c.stripe, 1)
	c.hot.served.Add(1)
	c.requests.Add(1)
	if crowded {
		c.t.counters.events[evCrowded].Add(1)
		c.t.events.log(evCrowded, slog.LevelWarn, "mwrpc: request refused: too many calls in flight "+what+")", "peer", c.peerAddr(), "max", limit)
		c.queueCtrl(wire.Header{Kind: wire.KindResponse, Status: uint16(StatusResourceExhausted), CallID: h.CallID}, sc.inv,
			fmt.Sprintf("mwrpc: too many calls in flight %s is %d)", what, limit))
		sc.w.sent = true
		sc.finish()
		return
	}
	probe.Mark(probe.Dispatch)
	if inline {
		// Run to completion here: no hand-off, and the response cannot wait on anything
		// this goroutine would have to reap (Config.InlineHandlers).
		sc.inline = true
		c.hot.inline.Add(1)
		c.p.runInline(sc)
		return
	}
	if err := c.t.workers.Invoke(sc); err != nil {
		// Overloaded: answer at once, without running anything.
		c.t.counters.events[evOverloaded].Add(1)
		c.t.events.log(evOverloaded, slog.LevelWarn, "mwrpc: request refused: every handler is busy", "peer", c.peerAddr(), "handlers", c.t.cfg.Handlers)
		c.queueCtrl(wire.Header{Kind: wire.KindResponse, Status: uint16(StatusResourceExhausted), CallID: h.CallID}, sc.inv,
			fmt.Sprintf("mwrpc: server overloaded: all %d handlers busy", c.t.cfg.Handlers))
		sc.w.sent = true
		sc.finish()
	}
}
