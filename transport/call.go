package transport

import (
	"context"
	"fmt"
	"runtime"

	"github.com/mwrpc/mwrpc/internal/idle"
	"github.com/mwrpc/mwrpc/internal/parcopy"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// call is a client call in flight. It is recycled: its Response is returned to the
// caller and the call goes back to its connection's spares (callTable) on Release.
type call struct {
	id   uint64
	done chan struct{}
	err  error
	resp Response
	st   *Stream // a stream's call: its response and failure go to the stream
	woke bool    // its response was delivered and counted in corks.woken, until its caller resumes
}

func (cl *call) finish(err error) {
	if cl.st != nil {
		cl.st.fail(err)
		return
	}
	cl.err = err
	cl.done <- struct{}{}
	probe.Mark(probe.Signalled)
}

// Response is the answer to a call. Bytes aliases registered memory (a receive slot, or
// the buffer a large response was READ into) and is valid until Release, which must be
// called exactly once.
type Response struct {
	c      *Conn
	cl     *call
	status Code
	data   []byte
	slot   int       // receive slot held, or -1
	buf    *pool.Buf // buffer held, or nil
}

// Bytes returns the response payload, valid until Release.
func (r *Response) Bytes() []byte { return r.data }

// Windowed reports whether the response came through a window (fetched by RDMA READ)
// rather than inside the SEND.
func (r *Response) Windowed() bool { return r.buf != nil }

// Status returns the handler's status code (StatusOK on success).
func (r *Response) Status() Code { return r.status }

// Release returns the response's memory to the connection. The Response and its Bytes
// must not be used afterwards.
func (r *Response) Release() {
	probe.Mark(probe.Release)
	c, cl := r.c, r.cl
	if c == nil {
		panic("mwrpc: Response released twice")
	}
	if r.buf != nil {
		r.buf.Release()
	} else if r.slot >= 0 {
		c.out.heldResp.Add(-1)
		c.releaseSlot(r.slot, true)
	}
	*r = Response{}
	cl.err = nil
	c.recycle(cl)
}

// Call sends req and waits for the response. A payload above the eager threshold is copied
// once into registered memory and exposed through a window; use CallBuf to build it there
// in the first place. When ctx ends first, Call sends a cancel to the server and returns
// ctx's error.
func (c *Conn) Call(ctx context.Context, req []byte) (*Response, error) {
	if len(req) > c.maxSend {
		return nil, fmt.Errorf("mwrpc: request of %d bytes (max %d): %w", len(req), c.maxSend, ErrTooLarge)
	}
	return c.CallParts(ctx, req, nil)
}

// CallParts is Call with the request in two parts, head then body (an rpc envelope and
// the caller's payload): up to the eager threshold both are copied straight into the send
// slot, one behind the other, with no copy to join them first; above it they are copied
// once into registered memory, as Call copies a request.
func (c *Conn) CallParts(ctx context.Context, head, body []byte) (*Response, error) {
	n := len(head) + len(body)
	if n > c.maxSend {
		return nil, fmt.Errorf("mwrpc: request of %d bytes (max %d): %w", n, c.maxSend, ErrTooLarge)
	}
	if n <= c.eager {
		return c.call(ctx, head, body, nil)
	}
	buf, err := c.t.pool.Get(ctx, n)
	if err != nil {
		return nil, fmt.Errorf("mwrpc: request buffer: %w", err)
	}
	c.CopyIn(buf.Bytes()[copy(buf.Bytes(), head):], body)
	return c.call(ctx, nil, nil, buf)
}

// copyRegistered copies p, a message above the eager threshold, into a pool buffer of its
// own, to be exposed through a window; what names the message in an error.
func (c *Conn) copyRegistered(ctx context.Context, p []byte, what string) (*pool.Buf, error) {
	buf, err := c.t.pool.Get(ctx, len(p))
	if err != nil {
		return nil, fmt.Errorf("mwrpc: %s buffer: %w", what, err)
	}
	c.CopyIn(buf.Bytes(), p)
	return buf, nil
}

// CopyIn copies src into dst, memory of the Transport's pool that holds a message of this
// connection (one about to leave, or one kept after it came), as the built-in copy does,
// and returns how many bytes it copied. Over shared memory (the shm fabric) it splits a
// copy of 256 KiB or more over idle cores, as the fabric's READs are split: the message's
// memory is resident and the pool's, reused, is too. Over a socket it splits only one of
// 4 MiB or more: split from 256 KiB, a 16-core A/B measured the soft TCP fabric's 1 MiB
// call 1.09x slower and the shm fabric's 0.89x faster
// (benchmarks/results/2026-11-27-manycore-f0ce1b9). The rpc package copies a large
// request's or response's bytes into their pool buffer with it.
func (c *Conn) CopyIn(dst, src []byte) int {
	if c.placesTransfers() {
		return parcopy.Copy(dst, src)
	}
	return parcopy.CopyLarge(dst, src)
}

// CallBuf is Call with a request built in registered memory: buf (its Len bytes) is sent
// without a copy: inside the SEND, gathered behind the header in the send slot, up to the
// eager threshold, and through a window above it. CallBuf takes ownership of buf, which
// returns to the pool once the server has it (the SEND completed, or the window was
// revoked). A buf of under 1 KiB is copied into the send slot instead and released at
// once: a copy that small costs less than gathering it.
func (c *Conn) CallBuf(ctx context.Context, buf *pool.Buf) (*Response, error) {
	if buf.Len() > c.maxSend {
		n := buf.Len()
		buf.Release()
		return nil, fmt.Errorf("mwrpc: request of %d bytes (max %d): %w", n, c.maxSend, ErrTooLarge)
	}
	return c.call(ctx, nil, nil, buf)
}

// busyPollCallMax is the largest request whose caller polls for its response
// (Config.BusyPoll): a larger call's response is further away, and its copies want the
// cores.
const busyPollCallMax = 4 << 10

// pollResponse polls for cl's response for up to Config.BusyPoll while the process is
// quiet (idle.Quiet), yielding between polls so that the goroutines that deliver it, and
// any other, run on this P meanwhile; the select that follows takes the response, or
// parks. On a quiet many-core machine the response comes in 10-20 µs, and a caller that
// parked would wait 5-20 µs more to be woken.
func (c *Conn) pollResponse(cl *call) {
	budget := c.t.cfg.BusyPoll
	if budget <= 0 || !idle.Quiet() {
		return
	}
	// Each poll yields first: the caller keeps no P from goroutines that have work. A
	// clock read and Quiet cost a few yields: one per 16.
	if _, ok := idle.Poll(budget, 16, true, func() bool { runtime.Gosched(); return len(cl.done) > 0 }); ok {
		c.hot.polled.Add(1)
	}
}

// call sends a request, eager then tail inside the SEND, or buf, which call owns: inside
// the SEND up to the eager threshold (gathered), else through a window. It waits for the
// response.
func (c *Conn) call(ctx context.Context, eager, tail []byte, buf *pool.Buf) (*Response, error) {
	large := buf != nil && buf.Len() > c.eager
	if probe.Enabled {
		probe.MarkN(probe.Call, b2u(large))
	}
	c.hot.calls.Add(1)
	cl, err := c.register()
	if err != nil {
		if buf != nil {
			buf.Release()
		}
		return nil, notSent(err)
	}

	h := wire.Header{Kind: wire.KindRequest, CallID: cl.id}
	if large {
		err = c.sendLarge(ctx, &h, buf, revoke{}, sendWait)
	} else {
		_, err = c.sendParts(ctx, &h, eager, tail, gatherBuf(buf), nil, revoke{}, sendWait)
	}
	if err != nil {
		if c.forgetCall(cl) {
			c.recycle(cl)
		} else { // the connection failed and finished the call
			<-cl.done
			c.resumed(cl)
			cl.err = nil
			c.recycle(cl)
		}
		return nil, err
	}
	if buf == nil && len(eager)+len(tail) <= busyPollCallMax {
		c.pollResponse(cl)
	}
	if ctx.Done() == nil { // a context that never ends: a receive, cheaper than a select
		<-cl.done
		return c.answered(cl)
	}
	select {
	case <-cl.done:
		return c.answered(cl)
	case <-ctx.Done():
	}
	if !c.forgetCall(cl) { // the response (or the failure) won the race
		<-cl.done
		c.resumed(cl)
		if cl.err == nil {
			cl.resp.Release()
		} else {
			cl.err = nil
			c.recycle(cl)
		}
		return nil, ctx.Err()
	}
	id := cl.id // cl may be another call's once recycled: its id is read first
	c.recycle(cl)
	c.queueCtrl(wire.Header{Kind: wire.KindCancel, CallID: id}, revoke{})
	return nil, ctx.Err()
}

// notSentError is the error of a call or stream that sent nothing: its connection's
// error, matching ErrNotSent too; its message is the connection's error's.
type notSentError struct{ err error }

func notSent(err error) error { return &notSentError{err} }

func (e *notSentError) Error() string   { return e.err.Error() }
func (e *notSentError) Unwrap() []error { return []error{e.err, ErrNotSent} }

// answered returns what ended cl, whose done signal its caller has just taken: its
// response, or the failure that finished it.
func (c *Conn) answered(cl *call) (*Response, error) {
	probe.Mark(probe.Woken)
	c.resumed(cl)
	if cl.err != nil {
		err := cl.err
		cl.err = nil
		c.recycle(cl)
		return nil, err
	}
	return &cl.resp, nil
}

// Ping sends a ping and waits for the pong: a round trip through both sides' pollers.
func (c *Conn) Ping(ctx context.Context) error {
	cl, err := c.register()
	if err != nil {
		return err
	}
	h := wire.Header{Kind: wire.KindPing, CallID: cl.id}
	if _, err := c.send(ctx, &h, nil, nil, revoke{}, sendWait); err != nil {
		if !c.forgetCall(cl) {
			<-cl.done
		}
		cl.err = nil
		c.recycle(cl)
		return err
	}
	select {
	case <-cl.done:
	case <-ctx.Done():
		if c.forgetCall(cl) {
			c.recycle(cl)
			return ctx.Err()
		}
		<-cl.done
	}
	err = cl.err
	cl.err = nil
	c.recycle(cl)
	return err
}

// deliver completes the call a response answers.
func (c *Conn) deliver(h *wire.Header, payload []byte, slot int, buf *pool.Buf) {
	c.mu.Lock()
	flush, err := c.creditsLocked(h)
	var cl *call
	if err == nil {
		cl = c.calls.takeLocked(h.CallID)
	}
	if cl != nil && cl.st == nil && slot >= 0 && !c.shared() {
		c.in.slots[slot].held = true // until Release (see leaveSlot)
	}
	c.mu.Unlock()
	if !c.afterCredits(flush, err) || cl == nil { // failed (every call with it), or the caller gave up
		if buf != nil {
			buf.Release()
		} else {
			c.releaseSlot(slot, true)
		}
		return
	}
	if cl.st != nil { // the stream's end, behind the messages before it
		m := &streamMsg{buf: buf, data: payload, ready: true}
		if buf == nil {
			m, _ = c.copyOut(payload, true)
			c.releaseSlot(slot, true)
		}
		m.end, m.status = true, Code(h.Status)
		cl.st.push(m, 0)
		return
	}
	if slot >= 0 {
		c.out.heldResp.Add(1) // until Release (see leaveSlot)
	}
	cl.resp = Response{c: c, cl: cl, status: Code(h.Status), data: payload, slot: slot, buf: buf}
	probe.Mark(probe.Deliver)
	c.wake(cl)
	cl.finish(nil)
}
