package transport

import (
	"unsafe"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// gathered is a part of a message in registered memory that its SEND carries behind the
// send slot's bytes (a second SGE) instead of a copy into the slot. The send slot owns it
// until the SEND completes (freeSendLocked) or the connection is torn down (releaseAll):
//   - buf, a buffer the sender gave up (Conn.CallBuf's request, Stream.SendBuf's message),
//     is released then;
//   - recv, a receive slot + 1 that the part lies in (a response that is its request's
//     bytes, an echo or a slice of the request: gatherFromRequest), is let go then, as its
//     handler lets go of it once it returns (letGoSlot): the last of the two reposts it.
type gathered struct {
	sge  verbs.SGE // where the part lies; Length 0: there is none
	buf  *pool.Buf
	recv int
}

// gatherBuf is a whole buffer (its Len bytes) to be gathered; none for nil.
func gatherBuf(buf *pool.Buf) gathered {
	if buf == nil {
		return gathered{}
	}
	return gathered{sge: verbs.SGE{Addr: buf.Addr(), Length: uint32(buf.Len()), LKey: buf.LKey()}, buf: buf}
}

// gatherBufMin is the smallest buffer a SEND gathers (gathered.small): a smaller one is
// copied behind the header in the send slot and released before the SEND is posted. Below
// it the copy costs less than a second scatter-gather entry does (its key checked and its
// region held by the provider, the buffer held until the SEND completes and released from
// there), and over the shm fabric a SEND under soft.PlacedSendMin is copied into the ring
// anyway.
const gatherBufMin = 1 << 10

// small returns the buffer of a buffer part under gatherBufMin, which its sender copies
// into the send slot as the tail rather than gathers, and then releases; nil for any other
// part, or when a tail comes before it (CallBuf and SendBuf send none).
func (g gathered) small(tail []byte) *pool.Buf {
	if g.buf == nil || g.sge.Length >= gatherBufMin || len(tail) > 0 {
		return nil
	}
	return g.buf
}

// gatherRequestMin is the smallest response part gathered from its request's receive slot.
// Below it the copy into the send slot costs under a microsecond, while the gathered
// response holds the request's slot until the peer acknowledges the SEND: with many small
// calls in flight, shared receive slots held that long would crowd the queue (at half of
// them held, requests are copied out of their slots: sharedCrowded).
const gatherRequestMin = 16 << 10

// gatherFromRequest returns p, a response part, as a part to gather when it lies in the
// request's receive slot and is worth it (gatherRequestMin); the slot then has a second
// holder, the response's SEND. Otherwise it returns none, and p is copied.
func (sc *serverCall) gatherFromRequest(p []byte) gathered {
	if sc.slot < 0 || len(p) < gatherRequestMin {
		return gathered{}
	}
	if _, ok := offsetOf(sc.req, p); !ok {
		return gathered{}
	}
	s := sc.c.slot(sc.slot)
	s.sharers.Add(1)
	return gathered{
		sge:  verbs.SGE{Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p)))), Length: uint32(len(p)), LKey: s.buf.LKey()},
		recv: sc.slot + 1,
	}
}

// drop gives back a part no send slot took (the send failed before it had one). c.mu is
// not held.
func (g gathered) drop(c *Conn) {
	if g.buf != nil {
		g.buf.Release()
	}
	if g.recv > 0 {
		c.letGoSlot(g.recv - 1)
	}
}

// letGoSlot ends one hold on receive slot i, whose message was a request: the last of its
// holders (the handler, and a response's SEND that gathered from it) releases it.
func (c *Conn) letGoSlot(i int) {
	s := c.slot(i)
	// No other holder (a second one is added only by the handler's own write, before it
	// lets go): released at once, without an atomic write per request.
	if s.sharers.Load() != 0 {
		if s.sharers.Add(-1) >= 0 {
			return // the other holder has it still
		}
		s.sharers.Store(0)
	}
	c.releaseSlot(i, true)
}

// letGoSlots is letGoSlot for each of recvs (receive slots + 1, zero for none).
func (c *Conn) letGoSlots(recvs ...int) {
	for _, r := range recvs {
		if r > 0 {
			c.letGoSlot(r - 1)
		}
	}
}
