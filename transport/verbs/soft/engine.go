package soft

import (
	"time"

	"github.com/mwrpc/mwrpc/internal/clock"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// engine is the QP's transmit loop: it sends the responder's output first (so a peer
// waiting on us is never stuck behind our own requests), then the send queue in order.
func (q *QP) engine(l link, stop <-chan struct{}) {
	defer q.wg.Done()
	for {
		select {
		case <-q.wake:
		case <-stop:
			return
		}
		probe.Mark(probe.EngWake)
		q.st.engineWakes.Add(1)
		for again := true; again; { // posters that found txMu held left theirs to us (takeTx)
			q.txMu.Lock()
			q.txAgain.Store(false)
			for q.step(l, 0) == stepMore {
			}
			q.flushTx(l)
			again = q.letGoTx()
		}
	}
}

// stepResult says what step did.
type stepResult uint8

const (
	stepMore  stepResult = iota // it did something; there may be more
	stepIdle                    // nothing (more) can be done now
	stepDefer                   // the next frame is too large for a poster: the engine's
)

// stepAfter is what a step that transmitted a frame returns, as the QP was before the
// frame left: stepMore while it has more that step would look at, else stepIdle, so that
// the transmitter's loop ends without taking q.mu once more to find nothing (each frame
// cost two acquisitions of the lock that the QP's posters and its reader share). q.mu is
// held. What is posted while the frame leaves is not lost: its poster finds txMu held and
// asks the holder for more (takeTx), which orAsked sees.
func (q *QP) stepAfter() stepResult {
	if q.engineHasWork() {
		return stepMore
	}
	return stepIdle
}

// orAsked is next (stepAfter's look, taken before the frame left), or stepMore where a
// poster queued work requests meanwhile and left them to this transmitter (txAgain): the
// next step takes them, where a round of its own (letGoTx, takeTx) would cost more, and
// after txRounds a wake-up of the engine.
func (q *QP) orAsked(next stepResult) stepResult {
	if next == stepIdle && q.txAgain.Load() && q.txAgain.Swap(false) {
		return stepMore
	}
	return next
}

// step transmits one frame or executes one local work request; txMu is held. A poster
// leaves frames with more than maxPayload bytes to the engine (0: the engine, no bound).
func (q *QP) step(l link, maxPayload int) stepResult {
	q.mu.Lock()
	if q.link != l {
		q.mu.Unlock()
		return stepIdle
	}
	// After a segment of a long READ response, a request of ours goes first if one can.
	preferSQ := q.txPreferSQ && q.sqSendable()
	q.txPreferSQ = false
	if q.outHead < len(q.outq) && !preferSQ {
		return q.stepOut(l, maxPayload)
	}
	if q.state != verbs.QPStateRTS || q.halted || q.rnrWait || q.sqNext == q.sqTail {
		if q.ackPending && q.ackDue { // nothing to carry it: the delayed ACK goes alone
			q.txHdr = header{op: opAck, psn: q.ackPSN}
			q.ackSent()
			q.mu.Unlock()
			q.transmit(l, &q.txHdr, nil)
			return stepMore
		}
		q.mu.Unlock()
		return stepIdle
	}
	return q.stepSQ(l, maxPayload)
}

// stepOut transmits the responder's next frame (an ACK, a NAK, a READ response or a
// segment of one). q.mu is held on entry and released.
func (q *QP) stepOut(l link, maxPayload int) stepResult {
	if maxPayload > 0 && len(q.outq[q.outHead].data) > maxPayload {
		q.mu.Unlock()
		return stepDefer
	}
	if head := &q.outq[q.outHead]; len(head.data) > readSegMax {
		return q.stepSegment(l, head)
	}
	f := q.outq[q.outHead]
	q.outq[q.outHead] = outFrame{}
	if q.outHead++; q.outHead == len(q.outq) {
		q.outq, q.outHead = q.outq[:0], 0
	}
	q.txHdr = f.h
	q.piggyback(&q.txHdr)
	next := q.stepAfter()
	q.mu.Unlock()
	segs := q.txSegs[:0]
	if len(f.data) > 0 {
		segs = append(segs, f.data)
	}
	q.transmit(l, &q.txHdr, segs)
	if f.mr != nil {
		f.mr.release(q.stripe)
	}
	return q.orAsked(next)
}

// stepSQ transmits the send queue's next work request, or executes it where it is local
// (BIND_MW, LOCAL_INV), unless it must wait. q.mu is held on entry and released.
func (q *QP) stepSQ(l link, maxPayload int) stepResult {
	// What waits in the SQ may not be able to go; a READ response we passed over can.
	idle := stepIdle
	if q.outHead < len(q.outq) {
		idle = stepMore
	}
	w := q.slot(q.sqNext)
	if w.done { // a local work request executed before a go-back-N rewind
		q.sqNext++
		q.mu.Unlock()
		return stepMore
	}
	if maxPayload > 0 && w.wr.Opcode != verbs.WRRDMARead && w.wr.Flags&verbs.SendInline == 0 && sgeBytes(w.sges) > uint64(maxPayload) {
		q.mu.Unlock()
		return stepDefer
	}
	switch w.wr.Opcode {
	case verbs.WRBindMW:
		return q.finishLocal(w, q.bind(&w.wr.Bind) == "", verbs.WCMWBindErr)
	case verbs.WRLocalInv:
		if q.sqHead != q.sqNext { // LOCAL_INV waits for every earlier work request
			q.mu.Unlock()
			return idle
		}
		return q.finishLocal(w, q.invalidate(w.wr.InvalidateRKey, false) == "", verbs.WCLocQPOpErr)
	case verbs.WRRDMARead:
		if q.rdOut >= q.maxRd { // READs beyond max_rd_atomic wait their turn
			q.mu.Unlock()
			return idle
		}
	}
	if w.wr.Flags&verbs.SendFence != 0 && q.rdOut > 0 {
		q.mu.Unlock()
		return idle
	}
	h, segs, ok := q.prepare(w)
	if !ok {
		return q.finishLocal(w, false, verbs.WCLocProtErr)
	}
	if !w.hasPSN {
		w.psn, w.hasPSN = q.nextPSN, true
		q.nextPSN = (q.nextPSN + 1) & psnMask
	}
	h.psn = w.psn
	q.txHdr = h
	q.piggyback(&q.txHdr)
	if q.sqHead == q.sqNext {
		q.lastRx.Store(clock.Nanos()) // the ACK timer counts from the first frame outstanding
	}
	w.sent = true
	if w.wr.Opcode == verbs.WRRDMARead {
		q.rdOut++
	}
	q.sqNext++
	if h.op.acked() && q.sqNext-q.sqHead >= q.ackReqAt() {
		q.txHdr.flags |= flagAckReq
	}
	q.armAckTimer()
	next := q.stepAfter()
	q.mu.Unlock()
	if tl, ok := l.(*tcpLink); ok && maxPayload == 0 && tl.keepable(&q.txHdr) {
		q.keepTx(tl, segs)
		return q.orAsked(next)
	}
	q.transmit(l, &q.txHdr, segs)
	q.releaseTx()
	return q.orAsked(next)
}

// keepTx hands the engine's large frame in q.txHdr (a 1 MiB WRITE, say) to the link, with
// the references to its memory: the link writes it with the frames stepped after it, in the
// flush that ends the engine's round (tcpLink.keep). txMu is held.
func (q *QP) keepTx(l *tcpLink, segs [][]byte) {
	if err := l.keep(&q.txHdr, segs, q.txMRs); err != nil {
		q.releaseTx()
		q.sendFailed(l, err)
		return
	}
	clear(q.txMRs) // the link's now
	q.txMRs = q.txMRs[:0]
}

// readSegMax is the largest READ response segment. A longer response leaves in segments,
// and a request of ours may go between two of them, as a fabric interleaves a response's
// MTU-sized packets with the requests of the same QP: a 64 B call on a connection that is
// also moving 16 MiB responses does not wait for a whole one (docs/protocol.md). Smaller
// segments (256 KiB) made 1 MiB calls 15% slower and small ones no faster: past this, a
// small frame waits for what the socket buffers already hold.
const readSegMax = 1 << 20

// stepSegment transmits the next readSegMax bytes of the READ response at the head of the
// output queue, which stays there with the rest (its header's raddr is the offset of what
// is left). q.mu is held on entry and released.
func (q *QP) stepSegment(l link, head *outFrame) stepResult {
	seg, m := head.data[:readSegMax], head.mr
	q.txHdr = head.h
	q.txHdr.len = readSegMax
	head.data = head.data[readSegMax:]
	head.h.len -= readSegMax
	head.h.raddr += readSegMax
	// The head keeps its own reference until its last byte leaves; this one covers the
	// segment in case the queue is dropped meanwhile (the region is valid: the head holds it).
	m.acquire(q.stripe)
	q.txPreferSQ = true
	q.piggyback(&q.txHdr)
	q.mu.Unlock()
	q.transmit(l, &q.txHdr, append(q.txSegs[:0], seg))
	m.release(q.stripe)
	return stepMore
}

// sqSendable reports whether the send queue has work step would look at. q.mu is held.
func (q *QP) sqSendable() bool {
	return q.state == verbs.QPStateRTS && !q.halted && !q.rnrWait && q.sqNext != q.sqTail
}

// engineHasWork reports whether step may find something to do: the receive path wakes the
// engine only then. A wake-up per received frame would cost a goroutine hand-off (and a
// futex call to start a thread for it) per message, for an ACK that waits for a frame of
// ours to carry it anyway. It errs on the side of yes. q.mu is held.
func (q *QP) engineHasWork() bool {
	return q.outHead < len(q.outq) || q.ackPending && q.ackDue || q.sqSendable()
}

func sgeBytes(sges []verbs.SGE) (n uint64) {
	for _, s := range sges {
		n += uint64(s.Length)
	}
	return n
}

// piggyback puts a pending ACK on a frame about to leave. q.mu is held.
func (q *QP) piggyback(h *header) {
	if q.ackPending {
		h.flags |= flagAck
		h.ack = q.ackPSN
		q.ackSent()
	}
}

// ackDelay bounds how long a responder holds an ACK for a frame of its own to carry it
// (the response to a request, typically), as TCP's delayed ACK and IB NICs' ACK coalescing
// do. A lone ACK costs a write and a wake-up of the peer's reader; it is rare in
// request/response traffic, whose every frame carries one. The bound matters to a sender
// of SENDs nobody answers, whose last few complete only with it (ackEvery frees the rest).
const ackDelay = time.Millisecond

// ackEvery is how many messages may be executed before the ACK goes at once, alone if no
// frame of ours carries it first: a stream of SENDs without replies keeps completing in
// steps of ackEvery, whatever ackDelay, as long as the sender's queue holds more. A
// sender whose queue is shorter asks for its ACK sooner (ackReqAt). Each lone ACK made
// due this way wakes the engine of a QP that has no frame of its own leaving: with 32
// callers on one connection in one process, the client's engine woke 0.08 times a call
// at 8 and 0.02 at 32; but senders then hold their send slots longer, and over shm the
// call took 1.06-1.3x the time in 7 of 10 pairs on 2 cores (level over soft TCP and in
// two processes).
const ackEvery = 8

// ackReqAt is how many messages of ours may be unacknowledged before the next SEND or
// WRITE asks for its ACK at once (flagAckReq): half the send queue, so that the ACK comes
// back while the other half still leaves. A queue of 2*ackEvery or more (every transport
// connection's) seldom reaches it against a peer that acknowledges every ackEvery
// messages. q.mu is held.
func (q *QP) ackReqAt() uint64 { return max(1, uint64(q.cap.MaxSendWR)/2) }

// ackSent records that the pending ACK left (or is queued to). q.mu is held.
func (q *QP) ackSent() {
	q.ackPending, q.ackDue, q.ackCount = false, false, 0
}

// armAckDelay arms the delayed-ACK timer to fire after d. It stays armed while messages
// keep coming (ackTimerFired), so that acknowledge, on the reader's path, finds it armed:
// arming a timer there would wake an idle thread to watch it (a futex call, or a write
// that breaks the poller's wait) on every message. q.mu is held.
func (q *QP) armAckDelay(d time.Duration) {
	q.ackTimerOn = true
	if q.ackDelayT == nil {
		q.ackDelayT = time.AfterFunc(d, q.ackTimerFired)
	} else {
		q.ackDelayT.Reset(d)
	}
}

// ackTimerFired sends the pending ACK if it has waited ackDelay; else the timer watches it
// for the rest of its delay, or stays armed a period more if a message was acknowledged
// since it last fired (traffic goes on), or lapses.
func (q *QP) ackTimerFired() {
	q.mu.Lock()
	q.ackTimerOn = false
	seen := q.ackSeen
	q.ackSeen = false
	if q.link == nil { // reset or destroyed: nothing to send, nothing to watch
		q.mu.Unlock()
		return
	}
	kick := false
	if q.ackPending && !q.ackDue {
		age := time.Duration(clock.Nanos() - q.ackSince)
		if age >= ackDelay {
			q.ackDue, kick = true, true
			q.st.delayedAcks.Add(1)
		} else {
			q.armAckDelay(ackDelay - age)
		}
	}
	if !q.ackTimerOn && seen {
		q.armAckDelay(ackDelay)
	}
	q.mu.Unlock()
	if kick {
		q.kick()
	}
}

// finishLocal ends a work request the requester completes without the wire (a bind, a
// local invalidation, or one refused before transmission): successfully if ok, else with
// st. q.mu is held on entry and released.
func (q *QP) finishLocal(w *swqe, ok bool, st verbs.WCStatus) stepResult {
	if ok {
		w.done = true
	} else {
		q.fail(w, st)
	}
	w.sent = true
	q.sqNext++
	q.completeSQ()
	q.mu.Unlock()
	return stepMore
}

// fail marks w finished with an error found by the requester; nothing more is transmitted
// and the QP moves to ERR when w completes in order. q.mu is held.
func (q *QP) fail(w *swqe, st verbs.WCStatus) {
	w.done, w.status, q.halted = true, st, true
}

// prepare builds the frame for w and resolves the memory it sends (acquired into txMRs).
// For an RDMA READ it checks the target memory (LOC_PROT_ERR if it is not writable) but
// does not hold it: the READ response resolves it again. q.mu is held.
func (q *QP) prepare(w *swqe) (header, [][]byte, bool) {
	var h header
	segs := q.txSegs[:0]
	switch w.wr.Opcode {
	case verbs.WRSend:
		h.op = opSend
	case verbs.WRSendWithImm:
		h.op, h.imm = opSendImm, w.wr.ImmData
	case verbs.WRSendWithInv:
		h.op, h.imm = opSendInv, w.wr.InvalidateRKey
	case verbs.WRRDMAWrite:
		h.op, h.rkey, h.raddr = opWrite, w.wr.RKey, w.wr.RemoteAddr
	case verbs.WRRDMAWriteWithImm:
		h.op, h.rkey, h.raddr, h.imm = opWriteImm, w.wr.RKey, w.wr.RemoteAddr, w.wr.ImmData
	case verbs.WRRDMARead:
		h.op, h.rkey, h.raddr = opReadReq, w.wr.RKey, w.wr.RemoteAddr
		for _, s := range w.sges {
			if s.Length == 0 {
				continue
			}
			_, m, ok := q.resolveLocal(s, true)
			if !ok {
				return h, nil, false
			}
			m.release(q.stripe)
			h.rlen += s.Length
		}
		return h, q.placeRead(q.link, w, &h), true
	}
	if w.wr.Flags&verbs.SendInline != 0 {
		if len(w.inline) > 0 {
			segs = append(segs, w.inline)
		}
		h.len = uint32(len(w.inline))
		return h, segs, true
	}
	for _, s := range w.sges {
		if s.Length == 0 {
			continue
		}
		b, m, ok := q.resolveLocal(s, false)
		if !ok {
			q.releaseTx()
			return h, nil, false
		}
		q.txMRs = append(q.txMRs, m)
		segs = append(segs, b)
		h.len += s.Length
	}
	w.byteLen = h.len
	switch w.wr.Opcode {
	case verbs.WRRDMAWrite:
		segs = q.placeWrite(q.link, &h, segs)
	case verbs.WRSend, verbs.WRSendWithImm, verbs.WRSendWithInv:
		segs = q.placeSend(q.link, w, &h, segs)
	}
	return h, segs, true
}

func (q *QP) releaseTx() {
	for i, m := range q.txMRs {
		m.release(q.stripe)
		q.txMRs[i] = nil
	}
	q.txMRs = q.txMRs[:0]
}

// transmit sends one frame. A peer that is not connected yet (in-process fabric) is
// retried, like a transport retry on a real fabric; a dead link moves the QP to ERR.
func (q *QP) transmit(l link, h *header, payload [][]byte) {
	err := l.send(h, payload)
	for i := 0; err == errNotReady; i++ {
		if time.Duration(i)*50*time.Microsecond > q.ackLimit() {
			break
		}
		time.Sleep(50 * time.Microsecond)
		err = l.send(h, payload)
	}
	if err != nil {
		q.sendFailed(l, err)
	}
}

// flushTx writes what the link gathered; every transmitting loop ends with it. txMu is held.
func (q *QP) flushTx(l link) {
	if err := l.flush(); err != nil {
		q.sendFailed(l, err)
	}
}

func (q *QP) ackLimit() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.timeout
	if t <= 0 {
		t = defaultTimeout
	}
	return t * time.Duration(q.retryCnt+1)
}

// armAckTimer makes sure a timer watches the outstanding work requests: when nothing has
// arrived from the peer for timeout*(retry_cnt+1), the request in flight completes with
// RETRY_EXC_ERR, as on a real fabric whose peer stopped answering. q.mu is held.
func (q *QP) armAckTimer() {
	if q.ackOn {
		return
	}
	q.ackOn = true
	if q.ackT == nil {
		q.ackT = time.AfterFunc(q.timeout, q.checkAck)
	} else {
		q.ackT.Reset(q.timeout)
	}
}

func (q *QP) checkAck() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ackOn = false
	if q.state != verbs.QPStateRTS || q.sqHead == q.sqNext {
		return
	}
	idle := time.Duration(clock.Nanos() - q.lastRx.Load())
	if idle >= q.timeout*time.Duration(q.retryCnt+1) {
		q.toError(verbs.WCRetryExcErr)
		return
	}
	q.armAckTimer()
}
