package transport

import (
	"context"
	"errors"
	"fmt"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Written responses. On a device where a READ costs a round trip through the peer's CPU
// (the soft TCP fabric), a large request's window also grants the server REMOTE_WRITE
// (wire.FlagWritable). The server, once it has READ the request, writes a response no
// longer than the request straight into that window with an RDMA WRITE, and announces it
// with the SEND_WITH_INV that revokes the window (wire.FlagWritten): one trip, where a
// window of its own costs the response's header, the caller's READ request and the READ's
// response. The WRITE's source buffer is held in a READ slot until the WRITE completes
// (onWriteDone). The caller takes the revoked window's buffer as the response's
// (onWritten), so the bytes land where it will read them, without a copy.
//
// The rules that keep it safe: the server writes only inside the window it was given (the
// NIC checks the key, range and access); it writes only while its revocation may still
// leave (within half the lease of the request's arrival, as every revocation: see send),
// so the window is still bound; and the caller accepts a written response only in a
// SEND_WITH_INV that revokes one of its windows, no longer than that window. Anything
// else is the peer breaking the protocol, and fails the connection.

// wrWrite is the work request kind of a written response's RDMA WRITE; its index is the
// READ slot holding the response's buffer.
const wrWrite = wrInv + 1

// maxWriting bounds the READ slots written responses hold at once. A connection has
// Credits + recvCtrlSlots of them, and the peer's large messages in flight, each READ into
// a slot, are at most Credits (each spends a credit): so written responses may hold
// recvCtrlSlots without ever leaving a large message without a slot. Beyond that a
// response goes through a window of its own.
const maxWriting = recvCtrlSlots

// writeDst is a caller's request window that the response may be written into.
type writeDst struct {
	addr uint64
	rkey uint32
	n    uint32 // its length: the most the response may be
}

// sendWritten writes buf (the response, h's) into dst with an RDMA WRITE and sends h as a
// written response that revokes rv, the same window. It takes buf. Without a READ slot
// to hold buf, or when the window is too old to revoke, the response goes through a
// window of its own instead (sendLarge).
func (c *Conn) sendWritten(ctx context.Context, h *wire.Header, buf *pool.Buf, rv revoke, dst writeDst, mode sendMode) error {
	c.mu.Lock()
	if len(c.rd.free) == 0 || c.rd.writing >= maxWriting || c.torn.Load() {
		c.mu.Unlock()
		return c.sendLarge(ctx, h, buf, rv, mode)
	}
	c.rd.writing++
	i := c.rd.free[len(c.rd.free)-1]
	c.rd.free = c.rd.free[:len(c.rd.free)-1]
	r := c.rd.ops[i]
	if r == nil {
		r = new(readOp)
		c.rd.ops[i] = r
	}
	r.buf, r.live = buf, true // teardown releases it from here on
	alone := c.loneLocked(false)
	c.mu.Unlock()
	if alone {
		c.peerCopies(buf.Len())
	}
	r.sge[0] = buf.SGE()
	wr := verbs.SendWR{WRID: wrid(wrWrite, c.id, i), Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL: r.sge[:], RemoteAddr: dst.addr, RKey: dst.rkey}
	hw := *h
	hw.Flags, hw.Len = wire.FlagWritten, uint32(buf.Len())
	c.t.counters.written.Add(1) // before the post: the caller may have the response before send returns
	pre := [1]verbs.SendWR{wr}
	posted, err := c.send(ctx, &hw, nil, pre[:], rv, mode)
	if posted {
		return nil
	}
	c.t.counters.written.Add(^uint64(0))
	// Not posted: buf is ours again, unless teardown took it (c.mu and torn decide).
	c.mu.Lock()
	mine := !c.torn.Load()
	if mine {
		r.buf, r.live = nil, false
		c.rd.free = append(c.rd.free, i)
		c.rd.writing--
	}
	c.mu.Unlock()
	if mine && errors.Is(err, errLate) {
		return c.sendLarge(ctx, h, buf, rv, mode) // too late to revoke: the lease reclaims it
	}
	if mine {
		buf.Release()
	}
	return err
}

// onWriteDone ends the hold on a written response's buffer: its WRITE completed.
func (c *Conn) onWriteDone(i int) {
	r := c.rd.ops[i] // set by sendWritten before the WRITE was posted
	c.mu.Lock()
	buf := r.buf
	r.buf, r.live = nil, false
	if buf != nil {
		c.rd.free = append(c.rd.free, i)
		c.rd.writing--
	}
	c.mu.Unlock()
	if buf != nil {
		buf.Release()
	}
}

// onWritten delivers a written response: the SEND_WITH_INV that announces it revokes the
// request window the peer wrote it into, whose buffer becomes the response's.
func (c *Conn) onWritten(h *wire.Header, wc *verbs.WorkCompletion) {
	// The caller's window holds its own request: nothing to clear there.
	buf, ok := c.writtenInto(h, wc, "response", "window", func(a verbs.Access) bool { return a&verbs.AccessRemoteWrite != 0 }, false)
	if !ok {
		return // failed the connection
	}
	c.deliver(h, buf.Bytes(), -1, buf)
}

// writtenInto takes the message of h.Len bytes the peer RDMA-wrote (a written response or
// request, what) into a window of ours (kind: "window" or "grant") and announced in the
// SEND_WITH_INV that revokes it: the window's buffer, cut to the message. The window must
// have granted an access that allowed the write (granted) and be long enough; otherwise,
// or when the SEND revokes nothing, the connection fails and ok is false. With
// clearUnwritten (a grant, not cleared when it was given: takeGrantBuf), what the message
// spans past the prefix the peer's WRITEs covered is cleared: the handler sees zeros
// there, never the bytes the buffer held before.
func (c *Conn) writtenInto(h *wire.Header, wc *verbs.WorkCompletion, what, kind string, granted func(verbs.Access) bool, clearUnwritten bool) (buf *pool.Buf, ok bool) {
	if wc.Flags&verbs.WCWithInv == 0 {
		c.fail(fmt.Errorf("%w: it sent a written %s that revokes no %s", ErrProtocol, what, kind))
		return nil, false
	}
	c.t.counters.revoked.Add(1)
	b, ok := c.revoked(wc.InvalidatedRKey)
	if !ok {
		return nil, false
	}
	if b.Buf == nil || uint64(h.Len) > b.Length || !granted(b.Access) {
		if b.Buf != nil {
			b.Buf.Release()
		}
		c.fail(fmt.Errorf("%w: it wrote a %s of %d bytes into window 0x%x, which is %d bytes and granted %v", ErrProtocol, what, h.Len, wc.InvalidatedRKey, b.Length, b.Access))
		return nil, false
	}
	b.Buf.SetLen(int(h.Len))
	if clearUnwritten && b.WrittenKnown && b.Written < uint64(h.Len) {
		clear(b.Buf.Bytes()[b.Written:])
	}
	return b.Buf, true
}
