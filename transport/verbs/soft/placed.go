package soft

import (
	"encoding/binary"
	"fmt"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// SharedMemoryWire is a stream whose two ends are processes on one host that share
// registered memory: the shm fabric's connection (transport/verbs/shm). Over it an RDMA
// READ is placed: the requester names its destination in memory it shared, and the
// responder, after the usual checks of the rkey, the range, the window's binding and the
// QP, copies the data straight there and answers with a completion that carries no payload.
// An RDMA WRITE is placed the other way round: the writer names its source in memory it
// shared, and the target, after the same checks, copies from there into its own memory and
// acknowledges as usual (the source stays the writer's, untouched, until that ACK
// completes the WRITE, as verbs require anyway). Either way one copy, by the owner of the
// memory the peer asked to reach, instead of one into the stream and one out of it.
type SharedMemoryWire interface {
	// ShareLocal returns where the peer finds buf, registered memory of this process, and
	// false when buf is not in memory the peer has mapped (not shared, or announced but not
	// yet mapped): the READ then goes through the stream as on any other wire.
	ShareLocal(buf []byte) (Placement, bool)
	// CopyToPeer copies src into the peer's shared memory at dst. It fails, wrapping
	// verbs.ErrPeerProtocol, when dst with len(src) bytes is not within memory the peer
	// shared: the peer named a destination it does not own.
	CopyToPeer(dst Placement, src []byte) error
	// CopyFromPeer copies len(dst) bytes of the peer's shared memory at src into dst,
	// failing as CopyToPeer does for a range the peer did not share.
	CopyFromPeer(dst []byte, src Placement) error
	// PeerCopies tells the wire that the peer will copy n bytes (a placed WRITE it pulls)
	// before it next answers, so that a reader waiting for that answer may poll for as
	// long as the copy takes rather than sleep through it (QP.PeerCopies). It never waits.
	PeerCopies(n int)
}

// Placement names bytes in memory a peer shared: a region it announced and an offset in it.
type Placement struct {
	Region uint32
	Offset uint64
}

// A placed READ request (opReadReq with flagPlaced) carries its destination as its payload,
// and a placed WRITE (opWrite with flagPlaced) its source, with its length in rlen;
// placementLen bytes, little-endian:
//
//	0 region u32 | 4 reserved u32 (0) | 8 offset u64
//
// The placed READ response (opReadResp with flagPlaced) has no payload: rlen is the bytes
// the responder placed, all of the READ, and raddr is 0.
//
// A placed SEND (opSend, opSendImm or opSendInv with flagPlaced) carries one placement per
// segment it gathers, at most MaxSendPlacements, each with the segment's length in the
// word READ and WRITE keep 0; rlen is the message's length, their sum.
const placementLen = 16

// PlacedSendMin is the least payload a SEND is placed with over a SharedMemoryWire. Below
// it the frame's bytes ride the stream with the others ready with it (a BATCH), and a copy
// of them costs less than the placement, its lookup and the peer's checks.
const PlacedSendMin = 1 << 10

// PlacedSendMax is the largest payload a SEND is placed with, unless it was posted after
// its QP's user said more are in flight (QP.PlaceLargeSends). A larger one goes through
// the stream, where the sender's copy into the ring and the receiver's out of it overlap
// (the reader takes the payload while it is written), and where the buffers it leaves
// from stay in the sender's cache: placed, the peer reads them, and the sender's next
// message into the same buffer waits for their lines to come back (a 64 KiB request's
// copy into its send slot took 6.9 µs instead of 1.5). One caller's 64 KiB calls over shm
// on 2 cores, two processes, all placed: 25 -> 54 µs p50 with the default client, whose
// copies then outlast the readers' spin (five alternating pairs).
const PlacedSendMax = 16 << 10

// MaxSendPlacements is the most segments a SEND placed over a SharedMemoryWire gathers: an
// envelope and its body, with room to spare; a SEND gathered from more goes through the
// stream.
const MaxSendPlacements = 4

// appendPlacement appends a placed READ's or WRITE's placement (its length word 0).
func appendPlacement(b []byte, p Placement) []byte { return appendSendPlacement(b, p, 0) }

// parsePlacement parses a placed READ's destination, bytes from the peer.
func parsePlacement(b []byte) (Placement, error) {
	p, r, err := splitPlacement(b, "placement")
	if err == nil && r != 0 {
		err = fmt.Errorf("%w: placement's reserved word is 0x%x", errFrame, r)
	}
	return p, err
}

// appendSendPlacement appends a placed SEND's placement of a segment of n bytes.
func appendSendPlacement(b []byte, p Placement, n int) []byte {
	b = binary.LittleEndian.AppendUint32(b, p.Region)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	return binary.LittleEndian.AppendUint64(b, p.Offset)
}

// parseSendPlacement parses one of a placed SEND's placements, bytes from the peer: where
// its segment lies, and its length (never 0).
func parseSendPlacement(b []byte) (Placement, int, error) {
	p, n, err := splitPlacement(b, "SEND placement")
	if err == nil && n == 0 {
		err = fmt.Errorf("%w: SEND placement of an empty segment", errFrame)
	}
	return p, int(n), err
}

// splitPlacement splits b, a placement from the peer (what names it in an error), into
// where it points and its length word.
func splitPlacement(b []byte, what string) (Placement, uint32, error) {
	if len(b) != placementLen {
		return Placement{}, 0, fmt.Errorf("%w: %s of %d bytes, want %d", errFrame, what, len(b), placementLen)
	}
	return Placement{Region: binary.LittleEndian.Uint32(b), Offset: binary.LittleEndian.Uint64(b[8:])}, binary.LittleEndian.Uint32(b[4:]), nil
}

// sharedWire returns l's shared-memory stream, or nil when l has none.
func sharedWire(l link) SharedMemoryWire {
	if tl, ok := l.(*tcpLink); ok {
		return tl.shared
	}
	return nil
}

// placeRead makes w's READ request a placed one when its destination is one buffer in
// memory the peer has mapped, and returns the request's payload (the placement); nil
// leaves it an ordinary READ. Each transmission decides anew. q.mu is held.
func (q *QP) placeRead(l link, w *swqe, h *header) [][]byte {
	w.placed = false
	sw := sharedWire(l)
	if sw == nil || h.rlen == 0 {
		return nil
	}
	var dst []byte
	for _, s := range w.sges {
		if s.Length == 0 {
			continue
		}
		if dst != nil {
			return nil // a scattered destination: the stream's way
		}
		b, m, ok := q.resolveLocal(s, true)
		if !ok {
			return nil
		}
		m.release(q.stripe)
		dst = b
	}
	p, ok := sw.ShareLocal(dst)
	if !ok {
		return nil
	}
	w.placed = true
	h.flags |= flagPlaced
	h.len = placementLen
	q.txPlace = appendPlacement(q.txPlace[:0], p)
	return append(q.txSegs[:0], q.txPlace)
}

// onPlacedRead executes a placed READ whose source b (in m, acquired) passed the checks:
// it copies b into the requester's memory and queues the completion. q.mu is held on
// entry and released. An error is the peer's: a bad placement, or one outside what it
// shared; the link goes down with it.
func (q *QP) onPlacedRead(h *header, src payloadSource, b []byte, m *mr) error {
	q.ePSN = (q.ePSN + 1) & psnMask
	l := q.link
	q.mu.Unlock()
	err := q.placeInto(l, src, b)
	if m != nil {
		m.release(q.stripe)
	}
	if err != nil {
		return err
	}
	q.mu.Lock()
	if q.state != verbs.QPStateError && q.link == l {
		q.outq = append(q.outq, outFrame{h: header{op: opReadResp, flags: flagPlaced, psn: h.psn, rlen: h.rlen}})
	}
	q.unlockAndKick()
	return nil
}

// readPlacement reads the placement a placed READ response or WRITE carries (op names
// which) from src, on a wire that must share memory.
func (q *QP) readPlacement(l link, src payloadSource, op string) (SharedMemoryWire, Placement, error) {
	sw := sharedWire(l)
	if sw == nil {
		return nil, Placement{}, fmt.Errorf("%w: a placed %s on a wire without shared memory", errFrame, op)
	}
	d := q.rxPlace[:] // not a local array: through the interface it would escape
	if err := src.fill(q, d); err != nil {
		return nil, Placement{}, err
	}
	p, err := parsePlacement(d)
	if err != nil {
		return nil, Placement{}, err
	}
	return sw, p, nil
}

// placeInto reads the placement from src and copies b there.
func (q *QP) placeInto(l link, src payloadSource, b []byte) error {
	sw, p, err := q.readPlacement(l, src, "READ")
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	if err := sw.CopyToPeer(p, b); err != nil {
		return fmt.Errorf("soft: qp %d: placed READ of %d bytes: %w", q.qpn, len(b), err)
	}
	q.st.placed.Add(uint64(len(b)))
	return nil
}

// onPlacedReadResponse completes a READ the responder placed: the data is in the target
// already. The response must answer a placed READ, all of it. q.mu is held on entry and
// released.
func (q *QP) onPlacedReadResponse(h *header, w *swqe) error {
	if !w.placed || w.rdGot != 0 || uint64(h.rlen) != sgeBytes(w.sges) {
		q.mu.Unlock()
		return fmt.Errorf("%w: placed READ response of %d bytes for a READ of %d (placed %v, %d bytes got)", errFrame, h.rlen, sgeBytes(w.sges), w.placed, w.rdGot)
	}
	if _, ok := q.resolveRecvSGEs(w.sges); !ok { // the target region went away meanwhile
		q.fail(w, verbs.WCLocProtErr)
	} else {
		q.releaseRx()
		w.rdGot = h.rlen
		w.done, w.byteLen = true, w.rdGot
	}
	q.rdOut--
	q.completeSQ()
	q.unlockAndKick()
	return nil
}

// placeWrite makes a WRITE from one buffer in memory the peer has mapped a placed one:
// its payload becomes the placement of segs, its length goes in rlen. Other WRITEs keep
// segs. q.mu is held; segs' regions are acquired (txMRs) until the frame has left, and the
// source stays untouched until the WRITE completes, by the verbs rules.
func (q *QP) placeWrite(l link, h *header, segs [][]byte) [][]byte {
	sw := sharedWire(l)
	if sw == nil || len(segs) != 1 {
		return segs
	}
	p, ok := sw.ShareLocal(segs[0])
	if !ok {
		return segs
	}
	h.flags |= flagPlaced
	h.rlen, h.len = h.len, placementLen
	q.txPlace = appendPlacement(q.txPlace[:0], p)
	return append(segs[:0], q.txPlace)
}

// pullWrite executes a placed WRITE into b: it reads the placement from src and copies the
// writer's source from there.
func (q *QP) pullWrite(src payloadSource, b []byte) error {
	sw, p, err := q.readPlacement(q.link, src, "WRITE")
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	if err := sw.CopyFromPeer(b, p); err != nil {
		return fmt.Errorf("soft: qp %d: placed WRITE of %d bytes: %w", q.qpn, len(b), err)
	}
	q.st.placed.Add(uint64(len(b)))
	return nil
}

// placeSend makes w, a SEND of PlacedSendMin to PlacedSendMax bytes (or more, posted after
// PlaceLargeSends(true)), gathered from at most MaxSendPlacements segments that all lie in
// memory the peer has mapped, a placed one: its payload becomes their placements, its
// length goes in rlen, and the peer copies the message from here straight into its
// receive. Other SENDs keep segs. q.mu is held;
// segs' regions are acquired (txMRs) until the frame has left, and the source stays
// untouched until the SEND completes (the peer's ACK, sent once it has copied), by the
// verbs rules. One copy, where the stream costs one into it and one out of it, or two out
// of it when the frame lands in the reader's read-ahead buffer first.
func (q *QP) placeSend(l link, w *swqe, h *header, segs [][]byte) [][]byte {
	sw := sharedWire(l)
	if sw == nil || h.len < PlacedSendMin || h.len > PlacedSendMax && !w.placeLarge || len(segs) > MaxSendPlacements {
		return segs
	}
	place := q.txPlace[:0]
	for _, b := range segs {
		p, ok := sw.ShareLocal(b)
		if !ok {
			return segs
		}
		place = appendSendPlacement(place, p, len(b))
	}
	q.txPlace = place
	h.flags |= flagPlaced
	h.rlen, h.len = h.len, uint32(len(place))
	return append(segs[:0], place)
}

// pullSend executes a placed SEND into segs, the receive's memory (room enough for n
// bytes, checked): it reads the placements from src and copies each segment from the
// sender's memory. An error is the peer's: placements that do not add up to n, or name
// memory it did not share.
func (q *QP) pullSend(src payloadSource, segs [][]byte, placements, n uint32) error {
	sw := sharedWire(q.link)
	if sw == nil {
		return fmt.Errorf("%w: a placed SEND on a wire without shared memory", errFrame)
	}
	d := q.rxPlaceSend[:placements] // not a local array: through the interface it would escape
	if err := src.fill(q, d); err != nil {
		return err
	}
	left := int(n)
	for ; len(d) > 0; d = d[placementLen:] {
		p, k, err := parseSendPlacement(d[:placementLen])
		if err != nil {
			return err
		}
		if k > left {
			return fmt.Errorf("%w: placed SEND segments of more than its %d bytes", errFrame, n)
		}
		left -= k
		for k > 0 { // the segment into the receive's scatter list, piece by piece
			m := min(k, len(segs[0]))
			if err := sw.CopyFromPeer(segs[0][:m], p); err != nil {
				return fmt.Errorf("soft: qp %d: placed SEND of %d bytes: %w", q.qpn, n, err)
			}
			p.Offset += uint64(m)
			k -= m
			if segs[0] = segs[0][m:]; len(segs[0]) == 0 {
				segs = segs[1:]
			}
		}
	}
	if left != 0 {
		return fmt.Errorf("%w: placed SEND segments of %d bytes short of its %d", errFrame, left, n)
	}
	q.st.placed.Add(uint64(n))
	return nil
}
