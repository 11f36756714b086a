package soft

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// PostSendBounded is PostSend for a caller whose work requests are a large RDMA WRITE and
// the SEND that announces it (a written request): the caller writes them itself, the
// WRITE's payload straight from registered memory and the SEND behind it in one writev, as
// the NIC engine would, rather than wake the engine (a goroutine hand-off, and on a
// many-core machine a thread woken on another core that reads the payload from this one's
// cache). It waits for a full socket no longer than ctx allows (its deadline, or a cancel,
// seen within boundCheck): once ctx is done, what the socket has not taken is copied and
// left to the engine, and the caller returns, so a peer that stopped reading (a partition)
// holds no caller past its deadline.
//
// It does so only where nothing else waits to be transmitted (the send queue sent up to
// these work requests, no READ response queued, nothing gathered or left by a write that
// never waits), on a plain TCP stream, and when no other goroutine transmits; otherwise it
// is PostSend.
func (q *QP) PostSendBounded(ctx context.Context, wrs []verbs.SendWR) error {
	q.mu.Lock()
	tl, ok := q.link.(*tcpLink)
	q.mu.Unlock()
	if !ok || !tl.boundable() || !q.takeTx() {
		return q.PostSend(wrs)
	}
	if q.td != nil {
		q.td.enter()
		defer q.td.exit()
	}
	q.mu.Lock()
	if q.link != link(tl) || !q.txQuiet(tl) {
		q.mu.Unlock()
		q.letGoTxKick()
		return q.PostSend(wrs)
	}
	posted, err := q.postLocked(wrs)
	end := q.sqTail
	q.mu.Unlock()
	if posted > 0 {
		q.transmitBounded(ctx, tl, end)
	} else {
		q.letGoTxKick()
	}
	return err
}

// letGoTxKick lets go of txMu and wakes the engine for a poster that asked for another
// round meanwhile (takeTx): their work requests are queued, and no one else may look.
func (q *QP) letGoTxKick() {
	if q.letGoTx() {
		q.kick()
	}
}

// txQuiet reports whether nothing waits to be transmitted ahead of what a poster is about
// to post. q.mu and txMu are held.
func (q *QP) txQuiet(tl *tcpLink) bool {
	return q.state == verbs.QPStateRTS && !q.halted && !q.rnrWait && q.sqNext == q.sqTail &&
		q.outHead == len(q.outq) && tl.out == nil && tl.pendN == 0 && len(tl.stage) == 0 && !tl.kept
}

// transmitBounded steps the send queue up to end (the work requests PostSendBounded
// queued: the WRITE is kept, the SEND gathered behind it) and writes them with one writev
// bounded by ctx. txMu is held on entry and let go.
func (q *QP) transmitBounded(ctx context.Context, tl *tcpLink, end uint64) {
	probe.Mark(probe.TxInline)
	q.st.boundedPosts.Add(1)
	for q.stepOwn(tl, end) == stepMore {
	}
	err := tl.flushBounded(ctx)
	again := q.letGoTx()
	switch {
	case errors.Is(err, errInterrupted):
		q.st.boundedCut.Add(1)
		q.kick() // the engine writes the rest first
	case err != nil:
		q.sendFailed(tl, err)
	case again || q.hasWork():
		q.kick() // what others posted or queued meanwhile is the engine's
	}
}

// hasWork is engineHasWork for a goroutine that does not hold q.mu.
func (q *QP) hasWork() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.engineHasWork()
}

// stepOwn is a step of the send queue only, up to end (what PostSendBounded queued): a
// READ response queued meanwhile is the engine's, as its write is not bounded. txMu is held.
func (q *QP) stepOwn(l link, end uint64) stepResult {
	q.mu.Lock()
	if q.link != l || q.sqNext >= end || !q.sqSendable() {
		q.mu.Unlock()
		return stepIdle
	}
	return q.stepSQ(l, 0)
}

// errInterrupted: a bounded write stopped at its caller's deadline or cancellation; what
// it did not write is left to the engine (leaveRest).
var errInterrupted = errors.New("soft: a bounded write was interrupted")

// boundable reports whether a poster may write on this link with a bounded wait: a plain
// TCP stream with a raw socket, whose large frames are kept for one writev.
func (l *tcpLink) boundable() bool {
	if l.raw == nil || !directWrites {
		return false
	}
	_, ok := l.conn.(*net.TCPConn)
	return ok
}

// boundCheck is how often a bounded write blocked on a full socket looks at its caller's
// context: a cancel ends the wait within it, a deadline at the deadline. Looking, rather
// than a context.AfterFunc that interrupts the write, costs a call no allocation.
const boundCheck = 20 * time.Millisecond

// flushBounded is flush for transmitBounded: it writes the kept frame and the frames
// gathered behind it, waiting for the socket until ctx is done (writeKeptUntil). txMu is
// held.
func (l *tcpLink) flushBounded(ctx context.Context) error {
	if !l.kept {
		return l.flush() // nothing large: small frames only
	}
	return l.writeKeptUntil(ctx)
}

// writeBounded writes l.bufs, waiting for a full socket until ctx ends: under write
// deadlines of at most boundCheck, after each of which it looks at ctx. errInterrupted:
// ctx ended first, and l.bufs holds what was not written.
func (l *tcpLink) writeBounded(ctx context.Context) error {
	if ctx.Done() == nil { // a context that never ends: the engine's write
		return l.writeBufs()
	}
	for {
		if !l.setDeadlineLinked(boundStep(ctx)) {
			return errLinkGone
		}
		err := l.writeBufs()
		switch {
		case err == nil || !errors.Is(err, os.ErrDeadlineExceeded): // written, or failed
		case ctx.Err() != nil:
			err = errInterrupted
		default:
			continue // a step's deadline: write on
		}
		l.setDeadlineLinked(time.Time{})
		return err
	}
}

// boundStep returns the write deadline of a bounded write's next step.
func boundStep(ctx context.Context) time.Time {
	t := time.Now().Add(boundCheck)
	if dl, ok := ctx.Deadline(); ok && dl.Before(t) {
		return dl
	}
	return t
}

// errLinkGone: the QP shut the link down during a bounded write (its deadline ended the
// write, shutdownLocked).
var errLinkGone = errors.New("soft: the link went down during a bounded write")

// setDeadlineLinked sets the stream's write deadline while the link is still its QP's, and
// reports whether it was: once the QP shuts the link down, the deadline is its
// (shutdownLocked), which a bounded write must not lift.
func (l *tcpLink) setDeadlineLinked(t time.Time) bool {
	l.q.mu.Lock()
	defer l.q.mu.Unlock()
	if l.q.link != link(l) {
		return false
	}
	_ = l.conn.SetWriteDeadline(t)
	return true
}

// leaveRest leaves what an interrupted writev did not write for the next flush, as a
// write that never waits leaves its rest (out): copied, so that the regions of the frame's
// payload are released now and every writer handles it as such a rest (the engine writes
// it first; readers and other posters leave it to the engine). The copy is the price of a
// caller that gave up while the socket was full, not of a call.
func (l *tcpLink) leaveRest() {
	rest := bytes.Join(l.bufs, nil)
	l.q.st.copied.Add(uint64(len(rest)))
	l.out = rest
}
