package soft

import (
	"fmt"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// payloadSource yields the payload of the frame being delivered: a socket on the TCP
// fabric, the sender's registered memory on the in-process fabric.
type payloadSource interface {
	// fill moves the next len(dst) payload bytes into dst, counting them against q's device.
	fill(q *QP, dst []byte) error
	// inMemory reports whether the whole payload is in memory already (it came with its
	// header, or is the in-process sender's), so that fill only copies and never waits.
	inMemory() bool
}

// lockedScatterMax is the largest payload in memory that a receive takes with q.mu held
// throughout (onRequest): copying 2 KiB takes well under 100 ns, less than letting go of
// the lock and taking it again, which the QP's posters, waiting on that lock, pay for.
const lockedScatterMax = 2 << 10

// deliver handles one incoming frame, which arrived at at (clock.Nanos: when the
// stream reader's read brought it, or when the in-process peer sent it). The caller
// delivers frames one at a time, in order; whatever payload deliver does not consume is
// discarded by the caller. It returns errLinkDown if the QP is gone, errNotReady if it is
// not yet in RTR, and the payload source's error if the stream broke.
func (q *QP) deliver(h *header, src payloadSource, at int64) error {
	q.rxMu.Lock()
	defer q.rxMu.Unlock()
	if q.rxClosed {
		return errLinkDown
	}
	q.lastRx.Store(at)
	q.mu.Lock()
	switch {
	case q.destroyed:
		q.mu.Unlock()
		return errLinkDown
	case q.state == verbs.QPStateInit || q.state == verbs.QPStateReset:
		q.mu.Unlock() // the peer got to RTS first: its transport retries
		return errNotReady
	case q.link == nil:
		q.mu.Unlock()
		return errLinkDown
	case q.state == verbs.QPStateError:
		q.mu.Unlock() // an ERR QP drops everything, as hardware does
		return nil
	}
	if h.flags&flagAck != 0 {
		q.ackUpTo(h.ack, true)
		q.completeSQ()
		if q.state == verbs.QPStateError {
			q.mu.Unlock()
			return nil
		}
	}
	switch h.op {
	case opAck:
		q.ackUpTo(h.psn, true)
		q.completeSQ()
		q.unlockAndKick()
		return nil
	case opNak:
		q.onNak(h)
		q.mu.Unlock()
		q.kick()
		return nil
	case opReadResp:
		return q.onReadResponse(h, src)
	}
	return q.onRequest(h, src)
}

// psnLE reports whether a comes at or before b in 24-bit sequence space.
func psnLE(a, b uint32) bool { return (b-a)&psnMask < 1<<23 }

// ackUpTo finishes the SENDs and WRITEs transmitted up to psn (to psn-1 when inclusive is
// false): ACKs are cumulative, and a NAK or READ response acknowledges what came before.
// q.mu is held.
func (q *QP) ackUpTo(psn uint32, inclusive bool) {
	for i := q.sqHead; i < q.sqNext; i++ {
		w := q.slot(i)
		if w.done || !w.sent || !w.hasPSN {
			continue
		}
		if !psnLE(w.psn, psn) || (!inclusive && w.psn == psn) {
			return
		}
		if w.wr.Opcode != verbs.WRRDMARead {
			w.done = true
		}
	}
}

// find returns the transmitted, unfinished work request with the given psn.
func (q *QP) find(psn uint32) *swqe {
	for i := q.sqHead; i < q.sqNext; i++ {
		if w := q.slot(i); w.sent && !w.done && w.hasPSN && w.psn == psn {
			return w
		}
	}
	return nil
}

func (q *QP) onNak(h *header) {
	q.ackUpTo(h.psn, false)
	w := q.find(h.psn)
	if w == nil {
		q.completeSQ()
		return
	}
	switch h.syn {
	case synRNR:
		if q.rnrRetry != infiniteRNR {
			if w.rnrLeft == 0 {
				q.fail(w, verbs.WCRNRRetryExcErr)
				q.completeSQ()
				return
			}
			w.rnrLeft--
		}
		q.goBack(w)
		q.rnrWait = true
		wait := time.Duration(h.imm) * time.Microsecond
		if q.rnrT == nil {
			q.rnrT = time.AfterFunc(wait, q.rnrExpired)
		} else {
			q.rnrT.Reset(wait)
		}
	case synAccess:
		q.fail(w, verbs.WCRemAccessErr)
	case synInvalid:
		q.fail(w, verbs.WCRemInvReqErr)
	default:
		q.fail(w, verbs.WCRemOpErr)
	}
	q.completeSQ()
}

// goBack rewinds transmission to w after an RNR NAK: the responder drops everything after
// the refused message, so it and every later request are sent again (local work requests
// already executed are not). q.mu is held.
func (q *QP) goBack(w *swqe) {
	var at uint64
	for i := q.sqHead; i < q.sqNext; i++ {
		if q.slot(i) == w {
			at = i
			break
		}
	}
	for i := at; i < q.sqNext; i++ {
		x := q.slot(i)
		if x.done || !x.sent {
			continue
		}
		x.sent, x.rdGot = false, 0
		if x.wr.Opcode == verbs.WRRDMARead {
			q.rdOut--
		}
	}
	q.sqNext = at
}

func (q *QP) rnrExpired() {
	q.mu.Lock()
	q.rnrWait = false
	q.mu.Unlock()
	q.kick()
}

// onReadResponse places READ response data, one segment (readSegMax) at a time, into the
// requester's target memory; the READ completes with its last byte. q.mu is held on entry
// and released.
func (q *QP) onReadResponse(h *header, src payloadSource) error {
	q.ackUpTo(h.psn, false)
	w := q.find(h.psn)
	if w == nil || w.wr.Opcode != verbs.WRRDMARead {
		q.completeSQ()
		q.mu.Unlock()
		return nil
	}
	if h.flags&flagPlaced != 0 {
		return q.onPlacedReadResponse(h, w)
	}
	total := sgeBytes(w.sges)
	if h.raddr != uint64(w.rdGot) || h.raddr+uint64(h.len) > total {
		q.mu.Unlock() // the responder broke the protocol: the link goes down
		return fmt.Errorf("%w: READ response of %d bytes at offset %d; expected offset %d of %d", errFrame, h.len, h.raddr, w.rdGot, total)
	}
	last := h.raddr+uint64(h.len) == total
	segs, ok := q.resolveRecvSGEs(w.sges)
	if !ok { // the target region went away after the READ was posted
		q.fail(w, verbs.WCLocProtErr)
		q.rdOut--
		q.completeSQ()
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	err := scatter(q, src, skipBytes(segs, int(h.raddr)), h.len)
	q.releaseRx()
	if err != nil {
		return err
	}
	q.mu.Lock()
	if w.sent && !w.done && w.hasPSN && w.psn == h.psn { // not flushed meanwhile
		w.rdGot += h.len
		if last {
			w.done, w.byteLen = true, w.rdGot
			q.rdOut--
			q.completeSQ()
		}
	}
	q.unlockAndKick()
	return nil
}

// skipBytes drops the first n bytes of segs, in place.
func skipBytes(segs [][]byte, n int) [][]byte {
	for n > 0 && len(segs) > 0 {
		if n < len(segs[0]) {
			segs[0] = segs[0][n:]
			return segs
		}
		n -= len(segs[0])
		segs = segs[1:]
	}
	return segs
}

// resolveRecvSGEs resolves SGEs the NIC writes (a receive, a READ target) into rxSegs,
// acquiring their regions into rxMRs.
func (q *QP) resolveRecvSGEs(sges []verbs.SGE) ([][]byte, bool) {
	segs := q.rxSegs[:0]
	for _, s := range sges {
		if s.Length == 0 {
			continue
		}
		b, m, ok := q.resolveLocal(s, true)
		if !ok {
			q.releaseRx()
			return nil, false
		}
		q.rxMRs = append(q.rxMRs, m)
		segs = append(segs, b)
	}
	return segs, true
}

func (q *QP) releaseRx() {
	for i, m := range q.rxMRs {
		m.release(q.stripe)
		q.rxMRs[i] = nil
	}
	q.rxMRs = q.rxMRs[:0]
}

// scatter fills segs, in order, with n payload bytes.
func scatter(q *QP, src payloadSource, segs [][]byte, n uint32) error {
	left := int(n)
	for _, s := range segs {
		if left == 0 {
			break
		}
		k := min(left, len(s))
		if err := src.fill(q, s[:k]); err != nil {
			return err
		}
		left -= k
	}
	return nil
}

// onRequest is the responder: SEND, WRITE and READ requests from the peer. q.mu is held on
// entry and released.
func (q *QP) onRequest(h *header, src payloadSource) error {
	if h.psn != q.ePSN {
		// After a NAK the requester goes back to the refused message; everything it had
		// sent after it is dropped here and sent again.
		q.mu.Unlock()
		return nil
	}
	switch h.op {
	case opReadReq:
		return q.onRead(h, src)
	case opWrite:
		return q.onWrite(h, src)
	}
	// SEND, SEND_WITH_IMM, SEND_WITH_INV and WRITE_WITH_IMM consume a receive.
	r := q.takeReceive()
	if r == nil {
		q.st.rnrNaks.Add(1)
		q.respond(header{op: opNak, syn: synRNR, psn: h.psn, imm: uint32(q.rnrTimer / time.Microsecond)})
		q.mu.Unlock()
		q.kick()
		return nil
	}
	n, placed := h.len, h.flags&flagPlaced != 0
	if placed { // a SEND the sender placed: rlen bytes, copied from its memory (placed.go)
		n = h.rlen
	}
	wc := verbs.WorkCompletion{WRID: r.wrid, Opcode: verbs.WCRecv, ByteLen: n, QPNum: q.qpn}
	segs, wmr, ok := q.placeRecv(h, n, &wc, r)
	if !ok {
		return nil // refused: the receive completed with the error, the QP is in ERR
	}
	// A small payload in memory is copied with q.mu held: nothing can move the QP
	// meanwhile. Otherwise the receive is this QP's now, whether it came from rq or the
	// SRQ: a move to ERR while the payload is placed completes it first, flushed (toError).
	locked := !placed && h.len <= lockedScatterMax && src.inMemory()
	if !locked {
		q.rxTaken, q.rxWC = true, wc
		q.mu.Unlock()
	}
	var err error
	if placed {
		err = q.pullSend(src, segs, h.len, n)
	} else {
		err = scatter(q, src, segs, h.len)
	}
	q.releaseRx()
	if wmr != nil {
		wmr.release(q.stripe)
	}
	if locked {
		return q.endRecv(h, wc, err, false)
	}
	q.mu.Lock()
	taken := q.rxTaken
	q.rxTaken = false
	if !taken { // flushed by toError meanwhile (or dropped by a reset)
		q.mu.Unlock()
		return err
	}
	return q.endRecv(h, wc, err, q.state == verbs.QPStateError)
}

// endRecv completes the receive a message consumed: flushed when its payload did not
// come whole (err: the stream broke, which ends the QP) or the QP moved to ERR meanwhile
// (flushed), else with the message. q.mu is held on entry and released.
func (q *QP) endRecv(h *header, wc verbs.WorkCompletion, err error, flushed bool) error {
	if err != nil || flushed {
		wc.Status = verbs.WCWRFlushErr
		q.rcq.push(wc)
		q.mu.Unlock()
		return err
	}
	q.completeRecv(h, wc)
	return nil
}

// takeReceive takes the oldest receive of the QP's own, or of its SRQ's (into q.rxWQE);
// nil when there is none. q.mu is held.
func (q *QP) takeReceive() *rwqe {
	switch {
	case q.srq != nil:
		if q.srq.take(&q.rxWQE) {
			return &q.rxWQE
		}
	case q.rqHead != q.rqTail:
		r := &q.rq[q.rqHead%uint64(len(q.rq))]
		q.rqHead++
		return r
	}
	return nil
}

// placeRecv says where a message of n bytes that consumes receive r lands: for
// WRITE_WITH_IMM the memory its rkey names (wmr, held until released), else r's scatter
// list. It fills in wc's opcode for WRITE_WITH_IMM. ok is false when the message is
// refused: the receive then completed with the error, the QP went to ERR and q.mu was
// released. q.mu is held on entry.
func (q *QP) placeRecv(h *header, n uint32, wc *verbs.WorkCompletion, r *rwqe) (segs [][]byte, wmr *mr, ok bool) {
	if h.op == opWriteImm {
		wc.Opcode, wc.Flags, wc.ImmData = verbs.WCRecvRDMAWithImm, verbs.WCWithImm, h.imm
		if h.len == 0 {
			return nil, nil, true
		}
		if q.access&verbs.AccessRemoteWrite == 0 {
			q.setFault(q.protocolFault(h, "the QP does not allow remote writes"))
			_ = q.refuse(h, wc, verbs.WCRemInvReqErr, synInvalid)
			return nil, nil, false
		}
		b, m, why := q.resolveRemote(h.rkey, h.raddr, uint64(h.len), verbs.AccessRemoteWrite)
		if why != "" {
			q.setFault(q.accessFault(h, h.rkey, h.raddr, h.len, why))
			_ = q.refuse(h, wc, verbs.WCRemAccessErr, synAccess)
			return nil, nil, false
		}
		return append(q.rxSegs[:0], b), m, true
	}
	segs, ok = q.resolveRecvSGEs(r.sges)
	if !ok {
		_ = q.refuse(h, wc, verbs.WCLocProtErr, synOperation)
		return nil, nil, false
	}
	var room uint64
	for _, s := range segs {
		room += uint64(len(s))
	}
	if uint64(n) > room {
		q.releaseRx()
		q.setFault(q.protocolFault(h, fmt.Sprintf("its %d bytes do not fit the %d-byte receive", n, room)))
		_ = q.refuse(h, wc, verbs.WCLocLenErr, synInvalid)
		return nil, nil, false
	}
	return segs, nil, true
}

// completeRecv completes a receive whose payload was placed: with its immediate data, or
// for SEND_WITH_INV after invalidating the rkey it carries (a refused invalidation fails
// the receive and the QP). q.mu is held on entry and released.
func (q *QP) completeRecv(h *header, wc verbs.WorkCompletion) {
	switch h.op {
	case opSendImm:
		wc.Flags, wc.ImmData = verbs.WCWithImm, h.imm
	case opSendInv:
		if why := q.invalidate(h.imm, true); why != "" {
			q.setFault(q.accessFault(h, h.imm, 0, 0, why))
			wc.Status = verbs.WCRemInvReqErr
			q.rcq.push(wc)
			q.respond(header{op: opNak, syn: synInvalid, psn: h.psn})
			q.toError(0)
			q.mu.Unlock()
			return
		}
		wc.Flags, wc.InvalidatedRKey = verbs.WCWithInv, h.imm
	}
	q.rcq.push(wc)
	q.acknowledge(h)
	q.unlockAndKick() // work the ACK it carried let go; the ACK of its own waits
}

// unlockAndKick releases q.mu and wakes the engine if it has something to do that no
// transmitter will: a goroutine that holds txMu (a poster, or the engine) is asked for
// another round instead (leaveToHolder). Under load a lane's send queue nearly always
// holds a request some caller is about to transmit when a response comes in, and a kick
// for it woke the engine only to wait for that caller's txMu.
func (q *QP) unlockAndKick() {
	kick := q.engineHasWork()
	q.mu.Unlock()
	if kick && !q.leaveToHolder() {
		q.kick()
	}
}

// leaveToHolder asks the goroutine that holds txMu for another round, as a poster does
// (takeTx), and reports whether it did: false when txMu was free, nobody transmits.
func (q *QP) leaveToHolder() bool {
	if q.takeTx() {
		q.txMu.Unlock() // the caller wakes the engine for the work, and what others asked
		return false
	}
	return true
}

// refuse completes the consumed receive with st, NAKs the message and moves the QP to ERR.
// q.mu is held on entry and released.
func (q *QP) refuse(h *header, wc *verbs.WorkCompletion, st verbs.WCStatus, syn syndrome) error {
	wc.Status = st
	q.rcq.push(*wc)
	q.respond(header{op: opNak, syn: syn, psn: h.psn})
	q.toError(0)
	q.mu.Unlock()
	q.kick()
	return nil
}

// reject NAKs a WRITE or READ the responder refuses and moves the QP to ERR (the IBTA's
// class of responder errors that end the connection). q.mu is held on entry and released.
func (q *QP) reject(h *header, syn syndrome) error {
	q.respond(header{op: opNak, syn: syn, psn: h.psn})
	q.toError(0)
	q.mu.Unlock()
	q.kick()
	return nil
}

func (q *QP) onWrite(h *header, src payloadSource) error {
	if q.access&verbs.AccessRemoteWrite == 0 {
		q.setFault(q.protocolFault(h, "the QP does not allow remote writes"))
		return q.reject(h, synInvalid)
	}
	var b []byte
	var m *mr
	n, placed := h.len, h.flags&flagPlaced != 0
	if placed {
		n = h.rlen
	}
	if n > 0 {
		var why string
		if b, m, why = q.resolveRemote(h.rkey, h.raddr, uint64(n), verbs.AccessRemoteWrite); why != "" {
			q.setFault(q.accessFault(h, h.rkey, h.raddr, n, why))
			return q.reject(h, synAccess)
		}
	}
	q.mu.Unlock()
	var err error
	switch {
	case placed:
		err = q.pullWrite(src, b)
	case m != nil:
		err = src.fill(q, b)
	}
	if m != nil {
		m.release(q.stripe)
	}
	if err != nil {
		return err
	}
	q.mu.Lock()
	if q.state != verbs.QPStateError {
		q.acknowledge(h)
	}
	q.unlockAndKick() // as after a SEND: its ACK waits for a frame of ours, or the timer
	return nil
}

// maxPendingReads bounds the READ responses a responder queues, whatever the peer asks.
const maxPendingReads = 2 * maxRdAtom

func (q *QP) onRead(h *header, src payloadSource) error {
	if q.access&verbs.AccessRemoteRead == 0 || q.maxDestRd == 0 || len(q.outq)-q.outHead >= maxPendingReads {
		q.setFault(q.protocolFault(h, "the QP does not allow remote reads, or more are outstanding than it allows"))
		return q.reject(h, synInvalid)
	}
	f := outFrame{h: header{op: opReadResp, psn: h.psn, len: h.rlen}}
	if h.rlen > 0 { // a zero-length READ touches no memory, so its key is not checked
		b, m, why := q.resolveRemote(h.rkey, h.raddr, uint64(h.rlen), verbs.AccessRemoteRead)
		if why != "" {
			q.setFault(q.accessFault(h, h.rkey, h.raddr, h.rlen, why))
			return q.reject(h, synAccess)
		}
		f.data, f.mr = b, m
	}
	if h.flags&flagPlaced != 0 {
		return q.onPlacedRead(h, src, f.data, f.mr)
	}
	q.ePSN = (q.ePSN + 1) & psnMask
	q.outq = append(q.outq, f)
	q.mu.Unlock()
	q.kick()
	return nil
}

// acknowledge records that the message h was executed; the ACK leaves on the next frame
// we send, or alone after ackDelay (or at once after ackEvery messages, or when h asks for
// it). The caller wakes the engine if it has work (engineHasWork). q.mu is held.
func (q *QP) acknowledge(h *header) {
	psn := h.psn
	q.ePSN = (psn + 1) & psnMask
	if !q.ackPending {
		q.ackPending, q.ackSince = true, q.lastRx.Load()
	}
	q.ackPSN = psn
	if q.ackCount++; q.ackCount >= ackEvery || h.flags&flagAckReq != 0 {
		q.ackDue = true
	}
	q.ackSeen = true
	if !q.ackTimerOn {
		q.armAckDelay(ackDelay)
	}
}

// respond queues a NAK or READ response behind earlier ones. q.mu is held.
func (q *QP) respond(h header) {
	if q.ackPending { // keep ACKs ahead of a NAK that follows them
		q.outq = append(q.outq, outFrame{h: header{op: opAck, psn: q.ackPSN}})
		q.ackSent()
	}
	q.outq = append(q.outq, outFrame{h: h})
}

// setFault records why the QP is about to move to ERR on its own: the first reason
// only (verbs.FaultReporter). q.mu is held.
func (q *QP) setFault(err error) {
	if q.fault == nil {
		q.fault = err
	}
}

// accessFault says which of the peer's requests named a key or range it may not use.
func (q *QP) accessFault(h *header, rkey uint32, addr uint64, n uint32, why string) error {
	return fmt.Errorf("soft: qp %d: the peer's %v (rkey 0x%x, %d bytes at 0x%x): %s: %w", q.qpn, h.op, rkey, n, addr, why, verbs.ErrRemoteAccess)
}

// protocolFault says which of the peer's requests the responder could not take.
func (q *QP) protocolFault(h *header, why string) error {
	return fmt.Errorf("soft: qp %d: the peer's %v of %d bytes: %s: %w", q.qpn, h.op, h.len, why, verbs.ErrPeerProtocol)
}
