package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mwrpc/mwrpc/internal/clock"
	"github.com/mwrpc/mwrpc/internal/idle"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// link carries a QP's frames to its peer. Only the QP's engine calls send.
type link interface {
	// send transmits one frame whose payload is the concatenation of payload.
	send(h *header, payload [][]byte) error
	// close tears the link down; the peer sees it go down.
	close()
	// flush transmits what send left pending (small frames gathered into one write).
	flush() error
	// setDeadline bounds the sends that follow (used while flushing before close).
	setDeadline(t time.Time)
	// peerLeft reports whether err, one of the link's send or flush errors, means that the
	// peer went away (QP.PeerLeft).
	peerLeft(err error) bool
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
	return l.peer.deliver(h, &l.src, clock.Nanos())
}

func (l *inprocLink) flush() error { return nil }

func (l *inprocLink) peerLeft(err error) bool { return meansPeerLeft(err) }

func (l *inprocLink) setDeadline(time.Time) {}

func (l *inprocLink) close() {
	// The peer learns at once, as from an RDMA CM disconnect.
	if p := l.peer; p.linkTo(l.local) {
		p.linkDown(nil, true)
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

func (s *sliceSource) inMemory() bool { return true }

func (s *sliceSource) fill(q *QP, dst []byte) error {
	q.st.copied.Add(uint64(len(dst)))
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

// tcpLink carries frames over a stream: payloads of more than smallMax bytes are written
// from registered memory with writev and read straight into registered memory; smaller
// ones travel with their header, gathered into one write until flush, and come in with
// one read (see wire.go).
type tcpLink struct {
	q    *QP
	conn net.Conn
	// ended: the reader found the stream's end (the peer left), and closed conn. A write
	// that fails on the closed conn after that is the peer's going too, not a link
	// broken some other way (peerLeft).
	ended atomic.Bool
	hdr   [headerLen]byte
	pend  []byte // headerLen bytes kept for a BATCH header, then the small frames to write
	pendN int    // frames in pend
	vec   net.Buffers
	bufs  net.Buffers // what WriteTo consumes; a field so that it does not escape per call
	// raw writes without waiting (tryFlush), on a plain TCP stream (nil over TLS); out is
	// what such a write left (of stage, or of pend's bytes), which the next flush or send
	// writes first.
	raw syscall.RawConn
	try TryWriter // the same, on a stream that has its own (the shm fabric's)
	// bw writes a frame's pieces as one where the stream can (the shm fabric's); nil:
	// net.Buffers.WriteTo, a writev(2) on a socket.
	bw BuffersWriter
	// tbw: the same without waiting, for a medium frame that a stream reader transmits
	// (tryWhole); nil on a socket.
	tbw TryBuffersWriter
	// shared: the stream's ends share registered memory (the shm fabric): READs are placed.
	shared SharedMemoryWire
	out    []byte
	// While trying (a stream reader transmits), frames larger than batchFrameMax are copied
	// to stage, behind pend's frames sealed in their wire form, for tryFlush's one write
	// (the first, when nothing is gathered before it, goes with sendNow instead).
	trying bool
	// While direct (a poster that is not a stream reader transmits, QP.transmitOnce) or
	// trying with nothing gathered yet, a large frame of up to tryTxMax bytes is written at
	// once with one writev that does not wait, straight from registered memory (sendNow);
	// what the socket does not take is copied to stage and left as out, for the engine to
	// write first.
	direct bool
	stage  []byte
	tryFn  func(fd uintptr) bool
	tryVFn func(fd uintptr) bool
	tryVec [][]byte
	iov    iovecs
	tryBuf []byte
	tryN   int
	tryErr error
	src    connSource
	fr     frameReader
	buf    bufSource
	guard  stallGuard
	// cork: the reader delivers a frame with whole frames read ahead behind it, so a held
	// post (QP.PostSendHeld) leaves its frames for it to write (held) before it waits on
	// the stream again (letGo). A held poster stores held before it loads cork, the reader
	// stores cork before it loads held: one of the two sees the other.
	cork atomic.Bool
	held atomic.Bool
	// kept: a large frame the engine took from the send queue (keep) waits in vec, straight
	// from registered memory, for the frames the engine steps after it: the next flush writes
	// it and them (pend) with one writev, so that the SEND announcing a 1 MiB WRITE costs no
	// write of its own. keptMRs are the references to its memory, released once written;
	// keptLen is its payload's length.
	kept    bool
	keptMRs []*mr
	keptLen uint32
}

// holdForReader reports whether a held post may leave what it gathered for the reader.
// txMu is held.
func (l *tcpLink) holdForReader() bool {
	l.held.Store(true)
	if l.cork.Load() {
		return true
	}
	// The poster writes now, and what others held goes with it (they held under txMu, as
	// this one does): the reader has nothing to write for them.
	l.held.Store(false)
	return false
}

// letGo is the reader's, before every read of the stream (which may wait): held posts hold
// no more, and what they left is written (as a reader writes: without waiting; the rest is the
// engine's).
func (l *tcpLink) letGo() {
	if l.cork.Load() { // a poster that saw it set stored held before: the load below sees it
		l.cork.Store(false)
	}
	if l.held.Load() {
		l.held.Store(false)
		l.q.transmitTry(l)
	}
}

// stallGuard bounds how long a frame, once begun, may stop arriving: a peer that sends a
// frame's first bytes and then nothing would otherwise hold the reader (and the receive
// it consumed) forever. It sets a read deadline only while a frame is incomplete, so an
// idle stream and a small frame that came in one read cost nothing.
type stallGuard struct {
	conn  interface{ SetReadDeadline(time.Time) error }
	limit *atomic.Int64 // nanoseconds; QP.stallLimit
	armed bool
}

// arm (re)starts the bound before a read of the current frame's bytes.
func (g *stallGuard) arm() {
	if g == nil || g.conn == nil {
		return
	}
	if d := g.limit.Load(); d > 0 {
		_ = g.conn.SetReadDeadline(time.Now().Add(time.Duration(d)))
		g.armed = true
	}
}

func (g *stallGuard) isArmed() bool { return g == nil || g.armed }

// disarm lifts the bound between frames.
func (g *stallGuard) disarm() {
	if g != nil && g.armed {
		_ = g.conn.SetReadDeadline(time.Time{})
		g.armed = false
	}
}

func (l *tcpLink) send(h *header, payload [][]byte) error {
	if err := l.flushOut(); err != nil {
		return err
	}
	if l.trying && h.len > batchFrameMax && !l.nowOK(h) {
		l.sealPend() // what came first leaves first
		l.stage = append(appendHeader(l.stage, h), zeroPad[:]...)
		for _, p := range payload {
			l.stage = append(l.stage, p...)
		}
		l.q.st.copied.Add(uint64(h.len))
		return nil
	}
	if h.len <= batchFrameMax && !l.wholeNow(h) {
		// A small frame is copied behind its header, as a NIC copies inline data into the
		// work request: one write(2) of it costs less than a writev of short segments
		// (about 0.4 µs a message more on the development VM), and the frames
		// ready together share it. A medium one too: copying 4 KiB costs less than the
		// write(2) it saves when others are ready with it (doorbell batching); alone, it
		// leaves padded, as a large frame does (flush).
		if len(l.pend)+headerLen+int(h.len) > headerLen+batchMax {
			if err := l.flush(); err != nil {
				return err
			}
		}
		if l.pend == nil { // it grows to what the link batches, up to batchMax
			l.pend = make([]byte, headerLen, headerLen+4<<10)
		}
		l.pend = appendHeader(l.pend, h)
		for _, p := range payload {
			l.pend = append(l.pend, p...)
		}
		l.pendN++
		l.q.st.copied.Add(uint64(h.len))
		return nil
	}
	if err := l.flush(); err != nil { // what came first leaves first
		return err
	}
	// A large frame: its header, the padding (wire.go), the payload from registered memory.
	l.vec = append(l.vec[:0], appendHeader(l.hdr[:0], h), zeroPad[:])
	l.vec = append(l.vec, payload...)
	// Counted before the write: the peer may have the bytes before writev returns here.
	l.q.st.socketTx.Add(uint64(h.len))
	probe.MarkN(probe.Writev, h.len)
	l.q.st.writes.Add(1)
	if (l.direct || l.trying) && l.nowOK(h) {
		err := l.sendNow()
		probe.Mark(probe.WritevDone)
		return err
	}
	l.bufs = l.vec
	var err error
	if h.len <= batchFrameMax { // a medium frame sent whole (wholeNow)
		err = l.writeBufs()
	} else {
		// A large one in pieces, also on a stream with a BuffersWriter: a shm reader that
		// sees the header first reads the payload straight from the ring into its slot,
		// where a whole frame would come through its read-ahead buffer, a copy more
		// (64 KiB at 16 callers, 2 cores: 0.77-0.92x the calls whole).
		_, err = l.bufs.WriteTo(l.conn)
	}
	probe.Mark(probe.WritevDone)
	clear(l.vec) // drop references to registered memory
	return err
}

// wholeNow reports whether the medium frame h leaves at once, straight from registered
// memory as a large frame does, rather than copied into pend first: on a stream that
// writes a frame's pieces as one (BuffersWriter: the shm ring, where gathering frames
// saves no system call), when a poster or the engine transmits with nothing gathered
// before it. A 4 KiB message so costs one copy into the ring, not two.
func (l *tcpLink) wholeNow(h *header) bool {
	return l.bw != nil && !l.trying && h.len > smallMax && l.pendN == 0
}

// keepable reports whether the engine may leave the large frame h to the next flush
// (keep): a frame the link would write on its own with writev, on a plain TCP stream (where
// one writev takes the frames behind it too; a TLS or shm stream writes each segment).
func (l *tcpLink) keepable(h *header) bool {
	if h.len <= batchFrameMax || l.trying || l.direct {
		return false
	}
	_, ok := l.conn.(*net.TCPConn)
	return ok
}

// keep takes the large frame h, whose payload lies in registered memory held by mrs, and
// leaves it for the next flush, which writes it with the frames sent after it (they are
// gathered in pend meanwhile): one writev for a WRITE and the SEND that announces it. The
// link takes mrs' references when it returns nil, and releases them once the frame is
// written; what was gathered before h leaves first, as it did. txMu is held by the engine
// (QP.stepSQ), whose every round ends with a flush, so the frame and its memory are held
// no longer than the round.
func (l *tcpLink) keep(h *header, payload [][]byte, mrs []*mr) error {
	if err := l.flush(); err != nil { // what came first leaves first
		return err
	}
	l.vec = append(l.vec[:0], appendHeader(l.hdr[:0], h), zeroPad[:])
	l.vec = append(l.vec, payload...)
	l.keptMRs = append(l.keptMRs, mrs...)
	l.kept, l.keptLen = true, h.len
	// Counted before the write: the peer may have the bytes before writev returns here.
	l.q.st.socketTx.Add(uint64(h.len))
	return nil
}

// writeKept writes the frame keep left in vec, and pend's frames behind it, with one writev;
// then it drops the references to registered memory and releases its regions.
func (l *tcpLink) writeKept() error { return l.writeKeptUntil(context.Background()) }

// writeKeptUntil is writeKept waiting for a full socket only until ctx ends
// (writeBounded); errInterrupted: what it did not write is left as the link's out
// (leaveRest).
func (l *tcpLink) writeKeptUntil(ctx context.Context) error {
	l.kept = false
	l.vec = l.appendPend(l.vec)
	probe.MarkN(probe.Writev, l.keptLen)
	l.q.st.writes.Add(1)
	l.bufs = l.vec
	err := l.writeBounded(ctx)
	probe.Mark(probe.WritevDone)
	if err == errInterrupted {
		l.leaveRest()
	}
	clear(l.vec)
	l.releaseKept()
	return err
}

// releaseKept releases the regions of the kept frame's memory, once it is written.
func (l *tcpLink) releaseKept() {
	for i, m := range l.keptMRs {
		m.release(l.q.stripe)
		l.keptMRs[i] = nil
	}
	l.keptMRs = l.keptMRs[:0]
}

// appendPend appends the pending frames' wire form to vec and empties pend: one alone as it
// is (a medium one with its padding), more as one BATCH. Their bytes stay where they are
// until written: nothing is added to pend before the write that takes vec.
func (l *tcpLink) appendPend(vec net.Buffers) net.Buffers {
	if l.pendN == 0 {
		return vec
	}
	b := l.pend[headerLen:]
	switch {
	case l.pendN > 1:
		appendHeader(l.pend[:0], &header{op: opBatch, len: uint32(len(b))})
		vec = append(vec, l.pend)
	case len(b) > headerLen+smallMax: // a medium frame alone
		vec = append(vec, b[:headerLen], zeroPad[:], b[headerLen:])
	default:
		vec = append(vec, b)
	}
	l.pend, l.pendN = l.pend[:headerLen], 0
	return vec
}

// nowOK reports whether the large frame h may go with sendNow: on a socket this OS writes
// without waiting, a frame of at most tryTxMax bytes with nothing gathered before it (while
// trying, a frame behind gathered ones is copied behind them, for one write).
func (l *tcpLink) nowOK(h *header) bool {
	return directWrites && l.raw != nil && h.len <= tryTxMax && l.pendN == 0 && len(l.stage) == 0 && l.out == nil && !l.kept
}

// sendNow writes the large frame in vec with one writev that does not wait. What the
// socket does not take is copied to stage and left as out (so that no reference to
// registered memory outlives the call), and the caller hands the link to the engine, which
// writes out first. A poster so saves the engine's wake-up (a goroutine hand-off, and on a
// many-core machine a thread woken on another core that reads the payload from this
// core's cache) for a frame the socket takes whole, the common case at 64 KiB.
func (l *tcpLink) sendNow() error {
	if l.tryVFn == nil {
		l.tryVFn = l.tryWritev // one closure for the link's life, not one per write
	}
	l.tryVec = l.vec
	err := l.raw.Write(l.tryVFn)
	n, werr := max(l.tryN, 0), l.tryErr
	l.tryVec, l.tryErr = nil, nil
	if err == nil && werr != syscall.EAGAIN && werr != syscall.EINTR {
		err = werr
	}
	if err == nil {
		l.stage = l.stage[:0]
		for _, b := range l.vec {
			k := min(n, len(b))
			n -= k
			l.stage = append(l.stage, b[k:]...)
		}
		if len(l.stage) > 0 {
			l.out = l.stage
			l.q.st.copied.Add(uint64(len(l.stage)))
		}
	}
	clear(l.vec) // drop references to registered memory
	return err
}

// flush writes the pending frames: one alone as it is (a medium one with its padding),
// more as one BATCH.
func (l *tcpLink) flush() error {
	if err := l.flushOut(); err != nil {
		return err
	}
	if l.kept {
		return l.writeKept()
	}
	if l.pendN == 0 {
		return nil
	}
	b, alone := l.pend[headerLen:], l.pendN == 1
	if !alone {
		appendHeader(l.pend[:0], &header{op: opBatch, len: uint32(len(b))})
		b = l.pend
	}
	l.pend, l.pendN = l.pend[:headerLen], 0
	var err error
	if alone && len(b) > headerLen+smallMax { // a medium frame
		l.vec = append(l.vec[:0], b[:headerLen], zeroPad[:], b[headerLen:])
		l.bufs = l.vec
		probe.MarkN(probe.Writev, uint32(len(b)-headerLen))
		l.q.st.writes.Add(1)
		err = l.writeBufs()
		probe.Mark(probe.WritevDone)
		clear(l.vec)
		return err
	}
	probe.MarkN(probe.Write, uint32(len(b)))
	l.q.st.writes.Add(1)
	_, err = l.conn.Write(b)
	probe.Mark(probe.WriteDone)
	return err
}

// tryFlush writes what waits (stage, and pend in its wire form: in place when nothing is
// staged, so a BATCH is not copied again) as far as the socket takes it without waiting,
// and reports whether all of it left. A stream reader that runs a completion handler
// transmits this way (QP.transmitTryOnce): it must never block on a socket, or two readers
// each writing to the other's full stream would deadlock. What the socket did not take
// (out) is the engine's to write first.
func (l *tcpLink) tryFlush() (bool, error) {
	if l.out != nil {
		return false, nil
	}
	if l.mediumAlone() && l.tbw != nil {
		return l.tryWhole()
	}
	b := l.pendInPlace()
	if b == nil {
		l.sealPend()
		b = l.stage
	}
	if len(b) == 0 {
		return true, nil
	}
	if l.tryFn == nil {
		l.tryFn = l.tryWrite // one closure for the link's life, not one per write
	}
	probe.MarkN(probe.Write, uint32(len(b)))
	l.q.st.writes.Add(1)
	n, err := l.writeNow(b)
	probe.Mark(probe.WriteDone)
	switch {
	case err != nil:
		return false, err
	case n == len(b):
		l.stage = l.stage[:0]
		return true, nil
	}
	l.out = b[n:]
	return false, nil
}

// mediumAlone reports whether pend holds one frame, a medium one (it leaves padded),
// with nothing staged before it.
func (l *tcpLink) mediumAlone() bool {
	return l.pendN == 1 && len(l.stage) == 0 && len(l.pend) > 2*headerLen+smallMax
}

// tryWhole is tryFlush of a medium frame alone, on a stream that takes a frame's pieces
// as one without waiting (TryBuffersWriter): its header, padding and payload go from pend
// into the stream, where sealing it into stage would copy it once more. What the stream
// does not take is copied to stage and left as out.
func (l *tcpLink) tryWhole() (bool, error) {
	b := l.pend[headerLen:]
	l.pend, l.pendN = l.pend[:headerLen], 0 // its bytes stay in place until copied below
	l.vec = append(l.vec[:0], b[:headerLen], zeroPad[:], b[headerLen:])
	l.bufs = l.vec
	probe.MarkN(probe.Write, uint32(len(b)-headerLen))
	l.q.st.writes.Add(1)
	_, err := l.tbw.TryWriteBuffers(&l.bufs)
	probe.Mark(probe.WriteDone)
	if err == nil {
		for _, r := range l.bufs {
			l.stage = append(l.stage, r...)
		}
	}
	clear(l.vec)
	l.bufs = nil
	if err != nil || len(l.stage) == 0 {
		return err == nil, err
	}
	l.q.st.copied.Add(uint64(len(l.stage)))
	l.out = l.stage
	return false, nil
}

// pendInPlace returns the pending frames' wire form where they lie, when nothing is
// staged before them and they need no padding (a BATCH, or a small frame alone), and
// empties pend: its bytes stay in place until written, since send and flush write out
// before they add to pend. Otherwise it returns nil, and pend is to be sealed into stage.
func (l *tcpLink) pendInPlace() []byte {
	if len(l.stage) > 0 || l.pendN == 0 {
		return nil
	}
	b := l.pend[headerLen:]
	switch {
	case l.pendN > 1:
		appendHeader(l.pend[:0], &header{op: opBatch, len: uint32(len(b))})
		b = l.pend
	case len(b) > headerLen+smallMax: // a medium frame alone leaves padded: staged
		return nil
	}
	l.pend, l.pendN = l.pend[:headerLen], 0
	return b
}

// sealPend moves the pending frames to stage in their wire form: one alone as it is (a
// medium one with its padding), more as one BATCH.
func (l *tcpLink) sealPend() {
	if l.pendN == 0 {
		return
	}
	b := l.pend[headerLen:]
	switch {
	case l.pendN > 1:
		l.stage = appendHeader(l.stage, &header{op: opBatch, len: uint32(len(b))})
		l.stage = append(l.stage, b...)
	case len(b) <= headerLen+smallMax:
		l.stage = append(l.stage, b...)
	default:
		l.stage = append(append(append(l.stage, b[:headerLen]...), zeroPad[:]...), b[headerLen:]...)
	}
	l.pend, l.pendN = l.pend[:headerLen], 0
}

// writeNow writes what the stream takes of b without waiting, and returns how much.
func (l *tcpLink) writeNow(b []byte) (int, error) {
	if l.try != nil {
		return l.try.TryWrite(b)
	}
	l.tryBuf = b
	err := l.raw.Write(l.tryFn)
	n, werr := max(l.tryN, 0), l.tryErr
	l.tryBuf, l.tryErr = nil, nil
	if err == nil && werr != syscall.EAGAIN && werr != syscall.EINTR {
		err = werr
	}
	return n, err
}

// TryWriter is implemented by streams that can write without waiting, as a non-blocking
// write(2) on a socket does (the shm fabric's connections): TryWrite writes as much of p as
// the stream takes at once and returns how much, 0 when it takes nothing now. A QP's stream
// reader that runs a completion handler sends through it (QP.transmitTryOnce) rather than wake
// the engine.
type TryWriter interface {
	TryWrite(p []byte) (int, error)
}

// BuffersWriter is implemented by streams that write several buffers as one, as writev(2)
// does on a socket, where net.Buffers.WriteTo would write them one at a time (the shm
// fabric's connections: each write publishes to the peer's reader, and may ring its
// doorbell). WriteBuffers writes all of v's bytes, waiting as Write does, and consumes v
// as net.Buffers.WriteTo does.
type BuffersWriter interface {
	WriteBuffers(v *net.Buffers) (int64, error)
}

// writeBufs writes l.bufs, consuming it: with the stream's BuffersWriter where it has one.
func (l *tcpLink) writeBufs() error {
	if l.bw != nil {
		_, err := l.bw.WriteBuffers(&l.bufs)
		return err
	}
	_, err := l.bufs.WriteTo(l.conn)
	return err
}

// TryBuffersWriter is implemented by streams that write several buffers as one without
// waiting (the shm fabric's connections): TryWriteBuffers writes as much of v's bytes as
// the stream takes at once, consumes it from v as net.Buffers.WriteTo does and returns
// how much, 0 when it takes nothing now.
type TryBuffersWriter interface {
	TryWriteBuffers(v *net.Buffers) (int64, error)
}

// flushOut writes what a partial tryFlush left, waiting for the socket as needed.
func (l *tcpLink) flushOut() error {
	if l.out == nil {
		return nil
	}
	l.q.st.writes.Add(1)
	_, err := l.conn.Write(l.out)
	l.out, l.stage = nil, l.stage[:0]
	return err
}

func (l *tcpLink) close() { _ = l.conn.Close() }

func (l *tcpLink) setDeadline(t time.Time) { _ = l.conn.SetWriteDeadline(t) }

// readLoop reads frames until the stream ends; then the QP's link is down.
func (l *tcpLink) readLoop() {
	defer l.q.wg.Done()
	var h header
	l.src.r, l.src.fr = l.conn, &l.fr
	l.fr.r = l.conn
	l.fr.wait = l.letGo // before every read of the stream
	l.guard = stallGuard{conn: l.conn, limit: &l.q.stallLimit}
	l.src.guard, l.fr.guard = &l.guard, &l.guard
	var err error
	for {
		l.guard.disarm()
		var small []byte
		if small, err = l.fr.next(&h); err != nil {
			break // the stream ended, or a peer that breaks the protocol is dropped
		}
		// Responses to this frame may wait for the next ones' while they are read ahead.
		rest := 0
		if small == nil {
			rest = int(h.len) // the payload, after the header and padding next took
		}
		if ahead := l.fr.aheadWhole(rest); ahead != l.cork.Load() {
			l.cork.Store(ahead)
		}
		probe.MarkN(probe.Frame, uint32(h.op))
		var src payloadSource = &l.src
		if small != nil { // in the reader's buffer: a small frame, or one of a BATCH
			l.buf.b = small
			src = &l.buf
		} else {
			l.src.left = int64(h.len)
		}
		// Completions this delivery adds to an armed CQ go to the CQ's handler, run here
		// once deliver has let go of the QP (verbs.DirectCQ); not while the reader waits
		// for payload bytes (connSource.fill).
		l.q.eachCQ((*cq).beginDefer)
		err = l.q.deliver(&h, src, l.fr.at)
		probe.MarkN(probe.Delivered, uint32(h.op))
		l.q.eachCQ((*cq).endDefer)
		if err == errNotReady { // cannot happen: the reader starts at RTR
			break
		}
		if err == nil && src == &l.src {
			err = l.src.discard(l.q)
		} else if err == nil && len(l.buf.b) > 0 {
			l.q.st.discarded.Add(uint64(len(l.buf.b)))
		}
		if err != nil {
			break
		}
	}
	fault, left := streamFault(err), meansPeerLeft(err)
	if fault == nil && left {
		l.ended.Store(true) // before the close that fails the writers
	}
	_ = l.conn.Close()
	l.q.linkDown(fault, left)
}

// peerLeft: the write's own error says so, or it failed on the stream the reader closed
// when it found the stream's end.
func (l *tcpLink) peerLeft(err error) bool {
	return meansPeerLeft(err) || l.ended.Load() && errors.Is(err, net.ErrClosed)
}

// streamFault tells why the stream ended apart from the peer leaving (its end, or ours):
// a malformed frame, or a frame whose bytes stopped coming (the guard's deadline). A
// stream closed in the middle of a frame counts as the peer leaving (a killed process does
// that).
func streamFault(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("soft: the peer stopped sending in the middle of a frame: %w", verbs.ErrPeerProtocol)
	case errors.Is(err, errFrame):
		return fmt.Errorf("soft: %w: %w", verbs.ErrPeerProtocol, err)
	case errors.Is(err, verbs.ErrPeerProtocol): // the stream's own check (the shm fabric's rings)
		return err
	}
	return nil
}

// frameReader splits a stream into frames (wire.go). Each read takes as much as the stream
// has and rb holds: a socket link's rb is headerLen+smallMax bytes until it carries a
// larger frame (a shm link's starts at readAhead), then readAhead, so that frames queued
// on the socket (several callers' 4 KiB requests, say) come in one read. A shm link's
// grows to the largest frame it carried up to maxReadAhead, so that a 64 KiB message's
// payload comes with its header. A payload beyond what a read brought in with its header
// is read straight into its destination (Read): a 1 MiB READ response is copied here for
// at most aheadMax bytes of it (or its largest BATCH's).
type frameReader struct {
	r io.Reader
	// rb[off:have] are the stream's next bytes, from the current frame's start; the
	// frame's header and small payload or BATCH (and, after Read took some, as much of a
	// larger payload) are rb[off:off+used].
	rb    []byte
	off   int
	have  int
	used  int
	batch []byte // the frames of the current BATCH not returned yet (in rb)
	guard *stallGuard
	wait  func() // called before every read of the stream (tcpLink.letGo), or nil
	poll  *busyPoll
	// lastLen is the payload length of the last frame next returned that had one.
	lastLen uint32
	// at is when the latest read of the stream brought bytes (clock.Nanos): when the
	// frames it brought arrived, for the QP's ACK timers (QP.deliver), without a clock
	// read per frame.
	at int64
	// direct: a payload past readAhead is read straight into its destination by a read
	// that never waits (connSource.now), so rb need not grow to hold it (aheadMax).
	direct bool
}

// aheadMax is the most rb grows to for one frame: readAhead where payloads are read
// direct, maxReadAhead elsewhere. Measured with two processes on 16 cores (8 each), 64 KiB
// calls over soft TCP: at one caller with a lent client 93.8 -> 78.7 µs, at 16 callers
// 75.4k -> 85.6k calls/s (2 of 2 alternating pairs each).
func (f *frameReader) aheadMax() int {
	if f.direct {
		return readAhead
	}
	return maxReadAhead
}

// readAhead is rb's size once a link has carried a frame larger than smallMax: what one
// read may take of the frames queued behind it. (An idle link that never did keeps the
// small one.)
const readAhead = 16 << 10

// maxReadAhead is the most a shm link's rb grows to for one frame (frameReader.aheadMax):
// a frame of tryTxMax payload bytes (a 64 KiB eager message and its envelope) with its
// header and padding. A link that has carried one keeps that much.
const maxReadAhead = headerLen + smallMax + tryTxMax

// next reads the next frame's header into h. A payload the reader holds, a small frame's
// (h.len <= smallMax) or one a BATCH carried, is returned, valid until the next call; for
// any other (small is nil) the caller must take h.len bytes with Read before calling next
// again. The frames of a BATCH are returned one by one; the BATCH itself never is.
func (f *frameReader) next(h *header) (small []byte, err error) {
	if len(f.batch) > 0 {
		return f.nextInBatch(h)
	}
	if f.rb == nil {
		f.rb = make([]byte, headerLen+smallMax)
	}
	f.off += f.used // past the previous frame (and what Read took of its payload)
	f.used = 0
	if f.off == f.have { // nothing read ahead: start again at the front
		f.off, f.have = 0, 0
	}
	if err := f.fill(headerLen); err != nil {
		return nil, err
	}
	if _, err := parseHeader(f.rb[f.off:f.off+headerLen], h); err != nil {
		return nil, err
	}
	if h.len > 0 { // a message's, not an ACK's: those come between a large message's
		f.lastLen = h.len
	}
	if h.op == opBatch {
		f.used = headerLen + int(h.len)
		if err := f.fill(f.used); err != nil {
			return nil, err
		}
		f.batch = f.rb[f.off+headerLen : f.off+f.used]
		return f.nextInBatch(h)
	}
	if h.len > smallMax {
		// Room for the whole frame, up to aheadMax: a stream whose payload reads wait
		// (the shm ring's) takes a 64 KiB eager message with its header in one read,
		// rather than in a second read into the receive slot with a reap before it; a
		// socket's reader takes readAhead with the header and the rest straight into the
		// slot with a read that never waits (connSource.now), a copy less.
		if want := min(max(readAhead, headerLen+smallMax+int(h.len)), f.aheadMax()); want > len(f.rb) {
			f.resize(want)
		}
	}
	if h.len <= smallMax {
		f.used = headerLen + int(h.len)
	} else {
		f.used = headerLen + smallMax // the header and the padding, and no payload byte
	}
	if err := f.fill(f.used); err != nil {
		return nil, err
	}
	if h.len > smallMax {
		return nil, nil
	}
	return f.rb[f.off+headerLen : f.off+f.used], nil
}

// aheadWhole reports whether rb holds the rest of the current frame (rest payload bytes
// that next did not take: a larger frame's) and the whole frame after it, so that the
// reader delivers both without reading the stream.
func (f *frameReader) aheadWhole(rest int) bool {
	if len(f.batch) > 0 {
		return true // the current frame is one of a BATCH, whose frames are all in rb
	}
	start := f.off + f.used + rest
	if start+headerLen > f.have {
		return false
	}
	b := f.rb[start:f.have]
	n := uint64(binary.LittleEndian.Uint32(b[8:])) // the payload length (wire.go); next checks the rest
	need := headerLen + n
	if opcode(b[0]) != opBatch && n > smallMax {
		need += smallMax // the padding
	}
	return uint64(len(b)) >= need
}

// Read takes the current frame's payload: first what the last reads brought in behind its
// header, then straight from the stream.
func (f *frameReader) Read(p []byte) (int, error) {
	if n := f.buffered(p); n > 0 {
		return n, nil
	}
	if f.wait != nil {
		f.wait()
	}
	return f.r.Read(p)
}

// buffered copies into p what rb holds of the current frame's payload, and returns how
// many bytes that was.
func (f *frameReader) buffered(p []byte) int {
	n := copy(p, f.rb[f.off+f.used:f.have])
	f.used += n
	return n
}

// nextInBatch parses the current BATCH's next frame, which must be a whole small one.
func (f *frameReader) nextInBatch(h *header) ([]byte, error) {
	rest, err := parseHeader(f.batch, h)
	switch {
	case err != nil:
		return nil, err
	case h.op == opBatch || h.len > batchFrameMax:
		return nil, fmt.Errorf("%w: a BATCH carries a %v of %d payload bytes (only frames of up to %d may be batched)", errFrame, h.op, h.len, batchFrameMax)
	case int(h.len) > len(rest):
		return nil, fmt.Errorf("%w: a %v of %d payload bytes overruns its BATCH (%d left)", errFrame, h.op, h.len, len(rest))
	}
	f.batch = rest[h.len:]
	return rest[:h.len], nil
}

// resize moves the current frame's bytes to the front of an rb of n bytes (at least what
// it holds).
func (f *frameReader) resize(n int) {
	rb := f.rb
	if n != len(rb) {
		rb = make([]byte, n)
	}
	f.have = copy(rb, f.rb[f.off:f.have])
	f.rb, f.off = rb, 0
}

// fill reads until rb holds n bytes of the current frame, and whatever more of the stream
// the same reads bring.
func (f *frameReader) fill(n int) error {
	if f.off+n > len(f.rb) { // no room behind the frame's start: to the front, or a larger rb
		// (a BATCH larger than any before: from now on the reader holds it)
		f.resize(max(n, len(f.rb)))
	}
	for f.have-f.off < n {
		if f.have > f.off && !f.guard.isArmed() { // the frame has begun: it must keep coming
			f.guard.arm()
		}
		if f.wait != nil {
			f.wait()
		}
		polled, from := f.pollNext()
		if polled > 0 {
			f.have += polled
			f.at = clock.Nanos()
			continue
		}
		probe.Mark(probe.Read)
		m, err := f.r.Read(f.rb[f.have:f.readEnd()])
		probe.MarkN(probe.ReadDone, uint32(m))
		if f.poll != nil {
			f.poll.lost(from)
		}
		if m > 0 {
			f.at = clock.Nanos()
		}
		f.have += m
		if err != nil && f.have-f.off < n {
			if err == io.EOF && f.have > f.off {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// readEnd is where a read into rb ends: rb's end, except when the reader reads a frame's
// first bytes after one whose payload it read straight into its destination (direct,
// past readAhead). The next is likely as large (the same method's next message), and a
// read of its header and padding alone leaves all of its payload to the read into the
// slot, rather than readAhead of it to be copied there out of rb (3 µs of each side's CPU
// per 64 KiB message at 16 callers in a profile). A small frame after it costs one read
// more; lastLen turns the read-ahead back on after it.
func (f *frameReader) readEnd() int {
	if f.direct && f.have == f.off && f.lastLen > readAhead {
		return min(len(f.rb), f.off+headerLen+smallMax)
	}
	return len(f.rb)
}

// pollNext polls the stream for the next frame where busy polling may (Device.SetBusyPoll):
// waiting for a frame's first byte, the last one small, on a quiet machine, where the next
// is a few microseconds away, less than a park and wake-up costs. It returns what it read
// into rb, and when it began polling in vain (zero: it did not poll).
func (f *frameReader) pollNext() (int, time.Time) {
	if f.have != f.off || f.poll == nil || f.lastLen > busyPollFrameMax {
		return 0, time.Time{}
	}
	return f.poll.read(f.rb[f.have:])
}

// busyPollFrameMax is the largest last frame after which a reader polls for the next: a
// larger message's successor is further away, and polling for it in a loop of reads that
// take part of it measured slower (64 KiB at one caller, 16 cores: 95 -> 126 µs).
const busyPollFrameMax = 4 << 10

// busyPoll is a stream reader's polling of its socket for the next frame before it parks
// (Device.SetBusyPoll). Owned by the reader.
type busyPoll struct {
	now    nowReader
	spin   idle.Spinner
	polled *atomic.Uint64 // Stats.BusyPolled
}

// read polls the socket for up to the spinner's budget while the process is quiet, and
// returns what it read. With nothing read (the budget ran out, the process is busy, or
// the socket had an error, which the read that follows, one that may wait, reports) it
// returns when it began polling, zero if it did not: the reader reports the whole wait
// with lost once that read returns.
func (p *busyPoll) read(b []byte) (int, time.Time) {
	if !idle.Quiet() {
		return 0, time.Time{}
	}
	// A clock read and Quiet cost about what a read of nothing does: one per 4 reads. The
	// caller this reader just woke may be waiting for this P: Poll yields between.
	m := 0
	start, ok := idle.Poll(p.spin.Budget(), 4, true, func() bool { m = p.now.read(b); return m > 0 })
	if !ok {
		return 0, start
	}
	p.spin.Won()
	p.polled.Add(1)
	return m, time.Time{}
}

// lost reports a wait that polling did not end, begun at start (zero: none).
func (p *busyPoll) lost(start time.Time) {
	if !start.IsZero() {
		p.spin.Lost(time.Since(start))
	}
}

// eachCQ calls f with the QP's receive CQ and, when it is another one, its send CQ.
func (q *QP) eachCQ(f func(*cq)) {
	f(q.rcq)
	if q.scq != q.rcq {
		f(q.scq)
	}
}

// bufSource hands over a small frame's payload, which came with its header.
type bufSource struct{ b []byte }

func (s *bufSource) inMemory() bool { return true }

func (s *bufSource) fill(q *QP, dst []byte) error {
	if len(dst) > len(s.b) {
		return io.ErrUnexpectedEOF
	}
	n := copy(dst, s.b)
	s.b = s.b[n:]
	q.st.copied.Add(uint64(n))
	return nil
}

// connSource reads a frame's payload: what fr read ahead, then the stream.
type connSource struct {
	fr    *frameReader
	r     io.Reader
	now   *nowReader // reads what the socket holds without waiting; nil where it cannot
	left  int64
	junk  []byte
	guard *stallGuard
}

func (s *connSource) inMemory() bool { return false }

func (s *connSource) fill(q *QP, dst []byte) error {
	if int64(len(dst)) > s.left {
		return io.ErrUnexpectedEOF
	}
	n := s.fr.buffered(dst) // read ahead with the header
	s.left -= int64(n)
	q.st.copied.Add(uint64(n))
	if n == len(dst) {
		return nil
	}
	// The reader defers its CQs' notifications (see readLoop), but not while it waits. What
	// the socket already holds of the payload comes first, up to nowReadMax: running the CQ
	// handler now (the poller's reap, 8-10 µs at 1 MiB in the timeline) would hold up bytes
	// that are there to take, and the peer's write behind them.
	if m := s.now.read(dst[n:min(len(dst), n+nowReadMax)]); m > 0 {
		s.left -= int64(m)
		q.st.socketRx.Add(uint64(m))
		if n += m; n == len(dst) {
			return nil
		}
	}
	q.eachCQ((*cq).endDefer)
	m, err := s.readFull(dst[n:])
	q.eachCQ((*cq).beginDefer)
	s.left -= int64(m)
	q.st.socketRx.Add(uint64(m))
	return err
}

// nowReadMax bounds the payload a reader takes from the socket before it lets its CQs'
// notifications go (connSource.fill): about 30 µs of copying on the development VM, so that
// the poller's completions wait no longer than that behind a large payload, which the
// peer's socket buffer (streamSendBuffer) keeps in flight a few hundred KiB at a time.
const nowReadMax = 256 << 10

// readFull is io.ReadFull with the stall guard re-armed before every read: a large
// payload may take long, but it must keep coming.
func (s *connSource) readFull(dst []byte) (int, error) {
	n := 0
	for n < len(dst) {
		s.guard.arm()
		if s.fr.wait != nil {
			s.fr.wait()
		}
		probe.Mark(probe.ReadPay)
		m, err := s.r.Read(dst[n:])
		probe.MarkN(probe.ReadPayDone, uint32(m))
		n += m
		if err != nil {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
	}
	return n, nil
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
		junk := s.junk[:min(s.left, int64(len(s.junk)))]
		n := s.fr.buffered(junk)
		m, err := s.readFull(junk[n:])
		n += m
		s.left -= int64(n)
		q.st.discarded.Add(uint64(n))
		if err != nil {
			return err
		}
	}
	return nil
}

var _ verbs.StreamQP = (*QP)(nil)
