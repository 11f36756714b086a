package soft

import (
	"io"
	"net"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// link carries a QP's frames to its peer. Only the QP's engine calls send.
type link interface {
	// send transmits one frame whose payload is the concatenation of payload.
	send(h *header, payload [][]byte) error
	// close tears the link down; the peer sees it go down.
	close()
	// setDeadline bounds the sends that follow (used while flushing before close).
	setDeadline(t time.Time)
}

// inprocLink delivers frames by calling the peer QP directly: the payload moves with one
// memcpy from the sender's registered memory to the receiver's.
type inprocLink struct {
	local *QP
	peer  *QP
	src   sliceSource
}

func (l *inprocLink) send(h *header, payload [][]byte) error {
	l.src = sliceSource{segs: payload}
	return l.peer.deliver(h, &l.src)
}

func (l *inprocLink) setDeadline(time.Time) {}

func (l *inprocLink) close() {
	// The peer learns at once, as from an RDMA CM disconnect.
	if p := l.peer; p.linkTo(l.local) {
		p.linkDown()
	}
}

// linkTo reports whether q's in-process link leads to peer.
func (q *QP) linkTo(peer *QP) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	l, ok := q.link.(*inprocLink)
	return ok && l.peer == peer
}

// sliceSource reads a payload out of the sender's memory.
type sliceSource struct {
	segs [][]byte
	off  int
}

func (s *sliceSource) fill(q *QP, dst []byte) error {
	q.dev.stats.copied.Add(uint64(len(dst)))
	for len(dst) > 0 {
		if len(s.segs) == 0 {
			return io.ErrUnexpectedEOF
		}
		n := copy(dst, s.segs[0][s.off:])
		dst = dst[n:]
		if s.off += n; s.off == len(s.segs[0]) {
			s.segs, s.off = s.segs[1:], 0
		}
	}
	return nil
}

// tcpLink carries frames over a stream: writev from registered memory, and reads straight
// into registered memory.
type tcpLink struct {
	q    *QP
	conn net.Conn
	hdr  [headerLen]byte
	vec  net.Buffers
	bufs net.Buffers // what WriteTo consumes; a field so that it does not escape per call
	src  connSource
}

func (l *tcpLink) send(h *header, payload [][]byte) error {
	l.vec = append(l.vec[:0], appendHeader(l.hdr[:0], h))
	l.vec = append(l.vec, payload...)
	l.bufs = l.vec
	// Counted before the write: the peer may have the bytes before writev returns here.
	l.q.dev.stats.socketTx.Add(uint64(h.len))
	_, err := l.bufs.WriteTo(l.conn)
	clear(l.vec) // drop references to registered memory
	return err
}

func (l *tcpLink) close() { _ = l.conn.Close() }

func (l *tcpLink) setDeadline(t time.Time) { _ = l.conn.SetWriteDeadline(t) }

// readLoop reads frames until the stream ends; then the QP's link is down.
func (l *tcpLink) readLoop() {
	defer l.q.wg.Done()
	var hb [headerLen]byte
	var h header
	l.src.r = l.conn
	for {
		if _, err := io.ReadFull(l.conn, hb[:]); err != nil {
			break
		}
		if _, err := parseHeader(hb[:], &h); err != nil {
			break // a peer that breaks the protocol is dropped, as on a fabric
		}
		l.src.left = int64(h.len)
		// Completions this delivery adds to an armed CQ go to the CQ's handler, run here
		// once deliver has let go of the QP (verbs.DirectCQ); not while the reader waits
		// for payload bytes (connSource.fill).
		rcq, scq := l.q.rcq, l.q.scq
		rcq.beginDefer()
		if scq != rcq {
			scq.beginDefer()
		}
		err := l.q.deliver(&h, &l.src)
		rcq.endDefer()
		if scq != rcq {
			scq.endDefer()
		}
		if err == errNotReady { // cannot happen: the reader starts at RTR
			break
		}
		if err == nil {
			err = l.src.discard(l.q)
		}
		if err != nil {
			break
		}
	}
	_ = l.conn.Close()
	l.q.linkDown()
}

// connSource reads a frame's payload from the stream.
type connSource struct {
	r    io.Reader
	left int64
	junk []byte
}

func (s *connSource) fill(q *QP, dst []byte) error {
	if int64(len(dst)) > s.left {
		return io.ErrUnexpectedEOF
	}
	// The reader is deferring its CQs' notifications (see readLoop); not while it waits.
	rcq, scq := q.rcq, q.scq
	rcq.pauseDefer()
	if scq != rcq {
		scq.pauseDefer()
	}
	n, err := io.ReadFull(s.r, dst)
	rcq.resumeDefer()
	if scq != rcq {
		scq.resumeDefer()
	}
	s.left -= int64(n)
	q.dev.stats.socketRx.Add(uint64(n))
	return err
}

// discard drops what the responder did not take of the current payload.
func (s *connSource) discard(q *QP) error {
	if s.left == 0 {
		return nil
	}
	if s.junk == nil {
		s.junk = make([]byte, 32<<10)
	}
	for s.left > 0 {
		n, err := io.ReadFull(s.r, s.junk[:min(s.left, int64(len(s.junk)))])
		s.left -= int64(n)
		q.dev.stats.discarded.Add(uint64(n))
		if err != nil {
			return err
		}
	}
	return nil
}

var _ verbs.StreamQP = (*QP)(nil)
