package transport

import (
	"fmt"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// readSlots fetch the peer's large messages: each with one RDMA READ from the peer's
// window into a pool buffer (startRead), handed on when the READ completes (onRead), after
// which the window's revocation is queued with the send queue. A READ slot per message in
// flight, made on first use and kept.
//
// Lock rules: free and unposted are guarded by Conn.mu. The slots themselves (ops) are
// the poller's: only it posts and completes READs, so it fills and empties them without
// the lock; teardown releases the buffer of a slot still live once the QP is destroyed.
type readSlots struct {
	ops      []*readOp // nil entries until first used
	free     []int     // indexes of slots with no READ
	unposted []int     // READs that came before RTS (startRead); connect posts them
	writing  int       // slots holding a written response's buffer (written.go), at most maxWriting
}

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
	if err == nil && len(c.rd.free) == 0 {
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
	i := c.rd.free[len(c.rd.free)-1]
	c.rd.free = c.rd.free[:len(c.rd.free)-1]
	c.mu.Unlock()
	r := c.rd.ops[i]
	if r == nil { // only the poller posts READs: no lock needed to make one
		r = new(readOp)
		c.rd.ops[i] = r
	}
	r.buf, r.h, r.at, r.live, r.st, r.msg = buf, *h, time.Now(), true, st, msg
	r.sge[0] = buf.SGE()
	r.wr[0] = verbs.SendWR{WRID: wrid(wrRead, c.id, i), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: r.sge[:], RemoteAddr: h.Addr, RKey: h.RKey}
	// A request can arrive while our QP is still in RTR (the peer reached RTS first), where
	// nothing may be posted: the READ waits for RTS (connect flushes it, via flushCtrl).
	c.mu.Lock()
	if !c.ready.Load() {
		c.rd.unposted = append(c.rd.unposted, i)
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
	reads := c.rd.unposted
	c.rd.unposted = nil
	c.mu.Unlock()
	for _, i := range reads {
		if err := c.qp.PostSend(c.rd.ops[i].wr[:]); err != nil { // made by startRead
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
		c.queueCtrl(wire.Header{Kind: wire.KindResponse, Status: uint16(StatusResourceExhausted), CallID: h.CallID}, revoke{h.RKey, time.Now()},
			fmt.Sprintf("mwrpc: the server cannot take a request of %d bytes now: %v", h.Len, why))
		return
	}
	c.queueInv(h.RKey, time.Now())
	if cl := c.takeCall(h.CallID); cl != nil {
		cl.finish(fmt.Errorf("%w: response of %d bytes: %w", ErrUnavailable, h.Len, why))
	}
}

// onRead completes the READ of a large message.
func (c *Conn) onRead(i int) {
	probe.Mark(probe.ReadDoneT)
	c.t.counters.reads.Add(1)
	r := c.rd.ops[i]
	buf, h, at, st, msg := r.buf, r.h, r.at, r.st, r.msg
	c.t.counters.readBytes.Add(uint64(buf.Len()))
	r.buf, r.live, r.st, r.msg = nil, false, nil, nil
	c.mu.Lock()
	c.rd.free = append(c.rd.free, i)
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
