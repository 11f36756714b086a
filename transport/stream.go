package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/mwrpc/mwrpc/internal/parcopy"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// Streams. A request with wire.FlagStream opens a stream on its call id. From then on
// both sides send KindStreamMsg messages on that id: the opener until its FlagEnd
// (CloseSend), the server until its response, which ends the stream. Each message is eager
// or, above the eager threshold, exposed through a window of its own and READ, exactly like
// a request; the receiver revokes the window as soon as the READ completes, so several
// chunks can be in flight at once.
//
// Flow control is per stream and per direction, in bytes: the receiver grants a window
// (Config.StreamWindow: the opener announces its own in the request's status field, in
// KiB; the server in its first KindStreamAck), and a sender may have at most that many
// bytes sent and not yet consumed — or one message of any size when nothing is
// outstanding, so that a message larger than the window still goes. The receiver returns
// consumed bytes on the stream messages it sends the other way (an eager message's rkey
// field: an ack riding it costs no SEND), and in a KindStreamAck of its own only when one
// is worth a SEND: once a quarter of the window is consumed, or when the sender said it is
// waiting for window (a KindStreamAck with status streamBlockedStatus, sent once per
// wait, as QUIC's STREAM_DATA_BLOCKED). So request/response traffic on a stream sends no
// acks of its own, a one-way flow one per quarter window, and a sender blocked on a
// message larger than what its window has left is never left waiting: its signal makes
// the receiver ack as soon as it consumed anything. A peer that sends past its window
// fails the connection (ErrProtocol).
//
// Memory: a received message is copied out of its receive slot into a pool buffer (a
// large one is READ straight into one), so a slow reader holds none of the connection's
// receive slots, only its stream's window of buffers. What Recv returns is valid until the
// next Recv or Close; Close (the opener's) or the handler's return (the server's) releases
// everything still queued, and a READ that completes after that releases its buffer.

const (
	// minStreamWindow is the smallest window a receiver grants, and the window a sender
	// assumes until the receiver's first ack says more.
	minStreamWindow = 64 << 10
	maxStreamWindow = 64 << 20
	// msgCost is what a message counts against the window besides its bytes: the queue
	// entry that holds it, so that a flood of empty messages is bounded too.
	msgCost = 64
)

// ErrStreamEnded is returned by a Send after this side ended its half of the stream
// (CloseSend, or a server's response).
var ErrStreamEnded = errors.New("mwrpc: send on a stream after its end")

// Stream is one streaming call's message flow, on the side that opened it
// (Conn.OpenStream) or the side that serves it (ResponseWriter.Stream). Send and Recv may
// be called from two goroutines at once (one sending, one receiving); each of them from
// one goroutine at a time.
type Stream struct {
	c      *Conn
	id     uint64
	caller bool  // this side opened it
	cl     *call // the opener's entry in the call table

	mu sync.Mutex
	// Two wake-ups, so that each side is woken only by what it waits for: an ack riding
	// a message, or one of its own, wakes no Recv (the reader would find nothing and park
	// again, a goroutine hand-off per message for nothing), and a message wakes no Send.
	recvWake chan struct{} // closed to wake a Recv or Header: a message, its READ, the end, a failure
	sendWake chan struct{} // closed to wake a Send waiting for window: an ack, a failure
	q        []*streamMsg  // received, in arrival order; an entry may still wait for its READ
	held     *streamMsg    // what Recv returned last: released by the next Recv or Close
	final    *streamMsg    // the opener's: the response, once Recv reached it
	err      error         // the stream failed: Recv (once the queue is empty) and Send return it
	eof      bool          // Recv reached the peer's end
	gotEnd   bool          // the peer's end arrived
	closed   bool          // Close or the handler's end: what arrives later is released
	hdr      []byte        // the peer's header message, once Header or Recv took it
	hdrSet   bool          // hdr was taken, or a message came first: the peer sent none before
	into     []byte        // a waiting RecvInto's buffer, offered to deliverInto
	intoN    int           // bytes deliverInto placed in into, or -1

	// Receiving: bytes arrived, released by Recv, and announced to the peer as consumed.
	window                    int
	received, consumed, acked int64
	peerBlocked               bool // the peer waits for window: what is consumed is acked at once

	// Sending: bytes sent and the peer's consumed and window, as its acks say.
	peerWindow         int
	sent, peerConsumed int64
	sendEnded          bool // this side ended its half
	saidBlocked        bool // this side told the peer it waits for window, and no ack came since
	peerEnded          bool // the opener's: the response arrived, so sending is over
}

// streamMsg is one received message, or the peer's end.
type streamMsg struct {
	buf    *pool.Buf // holds data, or nil (no payload, or a heap copy)
	data   []byte
	ready  bool // arrived (a large message: its READ completed)
	end    bool // the peer's end: its FlagEnd, or the response
	header bool // a header message (SendHeader), not one of the stream's messages
	status Code // the response's status
}

func (m *streamMsg) release() {
	if m.buf != nil {
		m.buf.Release()
		m.buf = nil
	}
	m.data = nil
}

func newStream(c *Conn, id uint64, caller bool, peerWindow int) *Stream {
	return &Stream{c: c, id: id, caller: caller, window: c.t.cfg.StreamWindow, peerWindow: peerWindow, intoN: -1}
}

// OpenStream opens a stream: open is its first message (the request), sent like a call's.
// The stream's messages then flow both ways until the server's response ends it, which
// Recv reports as io.EOF (Final then returns it). Close must be called once the stream is
// no longer used: before the response arrived, it cancels the call on the server.
func (c *Conn) OpenStream(ctx context.Context, open []byte) (*Stream, error) {
	if len(open) > c.maxSend {
		return nil, fmt.Errorf("mwrpc: stream request of %d bytes (max %d): %w", len(open), c.maxSend, ErrTooLarge)
	}
	if len(open) <= c.eager {
		return c.openStream(ctx, open, nil)
	}
	buf, err := c.copyRegistered(ctx, open, "stream request")
	if err != nil {
		return nil, err
	}
	return c.openStream(ctx, nil, buf)
}

func (c *Conn) openStream(ctx context.Context, eager []byte, large *pool.Buf) (*Stream, error) {
	c.t.counters.streams.Add(1)
	cl := &call{done: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		if large != nil {
			large.Release()
		}
		return nil, notSent(err)
	}
	c.calls.addLocked(cl) // with its stream, before a failure can find it
	st := newStream(c, cl.id, true, minStreamWindow)
	st.cl, cl.st = cl, st
	c.mu.Unlock()

	h := wire.Header{Kind: wire.KindRequest, Flags: wire.FlagStream, Status: uint16(min(st.window>>10, 0xffff)), CallID: cl.id}
	var err error
	if large != nil {
		err = c.sendLarge(ctx, &h, large, revoke{}, sendWait)
	} else {
		_, err = c.send(ctx, &h, eager, nil, revoke{}, sendWait)
	}
	if err != nil {
		c.forgetCall(cl)
		st.Close()
		return nil, err
	}
	return st, nil
}

// Stream returns the stream a request opened, or nil for a plain call. The handler's
// response (Write, or its return) ends the stream.
func (w *ResponseWriter) Stream() *Stream { return w.sc.st }

// ID returns the stream's call id (unique on its connection for the opener's side).
func (s *Stream) ID() uint64 { return s.id }

// EagerLimit returns the largest message sent inside a SEND; larger ones go through a
// window.
func (s *Stream) EagerLimit() int { return s.c.eager }

// MaxSend returns the largest message this stream may send.
func (s *Stream) MaxSend() int { return s.c.maxSend }

// Send sends one message: copied into a send slot, or above the eager threshold into
// registered memory exposed through a window. It waits while the peer's window is full.
// After the server's response it returns io.EOF (the opener's side; Recv then says how the
// stream ended).
func (s *Stream) Send(ctx context.Context, p []byte) error {
	if len(p) > s.c.maxSend {
		return fmt.Errorf("mwrpc: stream message of %d bytes (max %d): %w", len(p), s.c.maxSend, ErrTooLarge)
	}
	if len(p) <= s.c.eager {
		return s.send(ctx, p, nil)
	}
	buf, err := s.c.copyRegistered(ctx, p, "stream message")
	if err != nil {
		return err
	}
	return s.send(ctx, nil, buf)
}

// SendBuf is Send of a message built in registered memory: buf (its Len bytes) is sent
// without a copy, gathered into its SEND up to the eager threshold and through a window
// above it (under 1 KiB it is copied into the send slot, which costs less). SendBuf takes
// ownership of buf.
func (s *Stream) SendBuf(ctx context.Context, buf *pool.Buf) error {
	if buf.Len() > s.c.maxSend {
		n := buf.Len()
		buf.Release()
		return fmt.Errorf("mwrpc: stream message of %d bytes (max %d): %w", n, s.c.maxSend, ErrTooLarge)
	}
	return s.send(ctx, nil, buf)
}

// send sends eager (copied into the SEND) or buf, which it owns (see SendBuf).
func (s *Stream) send(ctx context.Context, eager []byte, buf *pool.Buf) error {
	return s.sendKind(ctx, eager, buf, 0)
}

// streamHeaderStatus marks a header message in a KindStreamMsg's status field.
const streamHeaderStatus = 1

// SendHeader sends p as the stream's header message, ahead of its messages: the peer's
// Header returns it and its Recv skips it. It counts against the window as a message.
func (s *Stream) SendHeader(ctx context.Context, p []byte) error {
	if len(p) > s.c.maxSend {
		return fmt.Errorf("mwrpc: stream header of %d bytes (max %d): %w", len(p), s.c.maxSend, ErrTooLarge)
	}
	if len(p) <= s.c.eager {
		return s.sendKind(ctx, p, nil, streamHeaderStatus)
	}
	buf, err := s.c.copyRegistered(ctx, p, "stream header")
	if err != nil {
		return err
	}
	return s.sendKind(ctx, nil, buf, streamHeaderStatus)
}

func (s *Stream) sendKind(ctx context.Context, eager []byte, buf *pool.Buf, status uint16) error {
	n := len(eager)
	if buf != nil {
		n = buf.Len()
	}
	if err := s.reserve(ctx, n); err != nil {
		if buf != nil {
			buf.Release()
		}
		return err
	}
	h := s.header(wire.KindStreamMsg)
	h.Status = status
	mode := sendWait
	if !s.caller {
		mode = sendResponse // a handler waits for a credit at most CreditTimeout
	}
	if buf != nil && buf.Len() > s.c.eager {
		return s.c.sendLarge(ctx, &h, buf, revoke{}, mode) // its rkey field is the window's
	}
	return s.sendWithAck(ctx, &h, eager, buf, mode)
}

// sendWithAck sends an eager stream message, eager copied or body gathered (which it
// owns), with what this side consumed and has not acknowledged riding in its rkey field.
// An ack taken for a message that could not go (a deadline while waiting for a credit) is
// sent alone: the peer may be waiting for it.
func (s *Stream) sendWithAck(ctx context.Context, h *wire.Header, eager []byte, body *pool.Buf, mode sendMode) error {
	s.mu.Lock()
	ack := s.takeAckLocked()
	s.mu.Unlock()
	h.RKey = uint32(ack)
	_, err := s.c.sendParts(ctx, h, eager, nil, gatherBuf(body), nil, revoke{}, mode)
	if err != nil {
		s.sendAck(ack, 0, 0)
	}
	return err
}

func (s *Stream) header(k wire.Kind) wire.Header {
	h := wire.Header{Kind: k, CallID: s.id}
	if s.caller {
		h.Flags = wire.FlagCaller
	}
	return h
}

// reserve waits until n more bytes fit the peer's window, and counts them sent.
func (s *Stream) reserve(ctx context.Context, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		switch {
		case s.err != nil:
			return s.err
		case s.closed || s.sendEnded:
			return ErrStreamEnded
		case s.peerEnded:
			return io.EOF
		}
		if out := s.sent - s.peerConsumed; out == 0 || out+int64(n+msgCost) <= int64(s.peerWindow) {
			s.sent += int64(n + msgCost)
			return nil
		}
		if !s.saidBlocked { // the peer acks only what is worth a SEND unless told this side waits
			s.saidBlocked = true
			ack := s.takeAckLocked()
			s.mu.Unlock()
			s.sendAck(ack, 0, streamBlockedStatus)
			s.mu.Lock()
			continue
		}
		if err := s.waitLocked(ctx, &s.sendWake); err != nil {
			return err
		}
	}
}

// CloseSend ends the opener's half of the stream: the server's Recv returns io.EOF once
// it has read everything before. The server may go on sending.
func (s *Stream) CloseSend(ctx context.Context) error {
	if !s.caller {
		return errors.New("mwrpc: CloseSend on the serving side (the response ends its half)")
	}
	s.mu.Lock()
	switch {
	case s.err != nil:
		err := s.err
		s.mu.Unlock()
		return err
	case s.sendEnded || s.closed:
		s.mu.Unlock()
		return nil
	}
	s.sendEnded = true
	ended := s.peerEnded
	s.mu.Unlock()
	if ended {
		return nil // the server no longer listens
	}
	h := s.header(wire.KindStreamMsg)
	h.Flags |= wire.FlagEnd
	return s.sendWithAck(ctx, &h, nil, nil, sendWait)
}

// Recv returns the next message, valid until the next Recv or Close. At the peer's end
// it returns io.EOF: the opener's CloseSend on the serving side, the server's response on
// the opener's (Final returns it). Messages that arrived before a failure are returned
// before its error.
func (s *Stream) Recv(ctx context.Context) ([]byte, error) {
	m, _, err := s.recv(ctx, nil)
	return m, err
}

// RecvInto is Recv into p, for a reader that copies what it receives anyway (a
// net.Conn's Read): it copies the next message into p and returns how many bytes, and
// the rest of a message larger than p, valid until the next Recv, RecvInto or Close. An
// empty message returns 0 and no rest. While it waits, an eager message that fits p is
// copied by the receiving side straight from its receive slot into p: one copy, no pool
// buffer and no queue entry (onStreamMsg, deliverInto). p is not written after RecvInto
// returns.
func (s *Stream) RecvInto(ctx context.Context, p []byte) (int, []byte, error) {
	m, n, err := s.recv(ctx, p)
	if err != nil || n >= 0 {
		return max(n, 0), nil, err
	}
	k := parcopy.CopyLarge(p, m)
	return k, m[k:], nil
}

// recv is Recv; with p not empty, its waits offer p to deliverInto. n is how many bytes
// deliverInto placed in p, or -1 when the message is returned.
func (s *Stream) recv(ctx context.Context, p []byte) ([]byte, int, error) {
	s.mu.Lock()
	if m := s.held; m != nil {
		s.held = nil
		s.consumed += int64(len(m.data) + msgCost)
		m.release()
	}
	for {
		if s.closed {
			s.mu.Unlock()
			return nil, -1, ErrStreamEnded
		}
		if len(s.q) > 0 && s.q[0].ready && s.q[0].header {
			s.takeHeaderLocked()
			continue
		}
		if len(s.q) > 0 && s.q[0].ready {
			return s.takeLocked()
		}
		if s.eof {
			s.mu.Unlock()
			return nil, -1, io.EOF
		}
		if s.err != nil && (len(s.q) == 0 || !s.q[0].ready) { // a pending READ never completes now
			err := s.err
			s.mu.Unlock()
			return nil, -1, err
		}
		// Nothing to read: what was consumed goes back now if the sender waits for it (or
		// a quarter of the window is due); otherwise it rides this side's next message.
		if ack := s.ackDueLocked(); ack > 0 {
			s.mu.Unlock()
			s.sendAck(ack, 0, 0)
			s.mu.Lock()
			continue
		}
		if len(p) > 0 {
			s.into, s.intoN = p, -1
		}
		err := s.waitLocked(ctx, &s.recvWake)
		s.into = nil // taken back under s.mu: deliverInto no longer writes p
		if s.intoN >= 0 {
			n := s.intoN
			s.intoN = -1
			ack := s.ackDueLocked()
			s.mu.Unlock()
			s.sendAck(ack, 0, 0)
			return nil, n, nil
		}
		if err != nil {
			s.mu.Unlock()
			return nil, -1, err
		}
	}
}

// takeLocked takes the ready message at the front of the queue for recv, and unlocks
// s.mu.
func (s *Stream) takeLocked() ([]byte, int, error) {
	m := s.popLocked()
	s.hdrSet = true // a message came first: no header precedes it
	ack := s.ackDueLocked()
	if m.end {
		s.eof = true
		s.final = m
	} else {
		s.held = m
	}
	s.mu.Unlock()
	s.sendAck(ack, 0, 0)
	if m.end {
		return nil, -1, io.EOF
	}
	return m.data, -1, nil
}

// popLocked takes the message at the front of the queue. The queue's array is kept when
// it empties, so that request/response traffic, which empties it at every message,
// queues without allocating. s.mu is held.
func (s *Stream) popLocked() *streamMsg {
	m := s.q[0]
	s.q[0] = nil
	if len(s.q) == 1 {
		s.q = s.q[:0]
	} else {
		s.q = s.q[1:]
	}
	return m
}

// takeHeaderLocked takes the header message at the front of the queue: a copy is kept
// for Header, the buffer goes back, and its bytes count as consumed. s.mu is held.
func (s *Stream) takeHeaderLocked() {
	m := s.popLocked()
	if !s.hdrSet {
		s.hdr, s.hdrSet = bytes.Clone(m.data), true
	}
	s.consumed += int64(len(m.data) + msgCost)
	m.release()
}

// Header waits for the peer's header message (SendHeader) and returns it (a copy, the
// caller's), or nil, false when the peer sent a message, ended the stream or failed
// without one first. It may be called while another goroutine sends, not while one
// receives.
func (s *Stream) Header(ctx context.Context) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if len(s.q) > 0 && s.q[0].ready && s.q[0].header {
			s.takeHeaderLocked()
		}
		switch {
		case s.hdrSet:
			return s.hdr, s.hdr != nil, nil
		case len(s.q) > 0 && !s.q[0].header, s.eof, s.gotEnd && len(s.q) == 0:
			return nil, false, nil
		case s.err != nil && (len(s.q) == 0 || !s.q[0].ready):
			return nil, false, s.err
		}
		if err := s.waitLocked(ctx, &s.recvWake); err != nil {
			return nil, false, err
		}
	}
}

// Final returns the server's response once Recv has returned io.EOF on the opener's side:
// its status and payload, valid until Close. ok is false before that.
func (s *Stream) Final() (status Code, payload []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final == nil {
		return 0, nil, false
	}
	return s.final.status, s.final.data, true
}

// Close releases what the stream holds. On the opener's side, before the response
// arrived, it cancels the call on the server. Close may be called more than once.
func (s *Stream) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closeLocked(ErrStreamEnded)
	s.mu.Unlock()
	if s.caller && s.c.forgetCall(s.cl) { // still in the call table: no response yet
		s.c.queueCtrl(wire.Header{Kind: wire.KindCancel, CallID: s.id}, revoke{})
	}
}

// closeLocked releases everything queued or held; s.mu is held.
func (s *Stream) closeLocked(err error) {
	s.closed = true
	if s.err == nil {
		s.err = err
	}
	for _, m := range s.q {
		if m.ready {
			m.release()
		} // one still being READ is released when the READ completes (fill)
	}
	s.q = nil
	for _, m := range []*streamMsg{s.held, s.final} {
		if m != nil {
			m.release()
		}
	}
	s.held, s.final = nil, nil
	s.wakeAllLocked()
}

// fail ends the stream with err: the connection failed, or the call was canceled.
func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.wakeAllLocked()
	s.mu.Unlock()
}

// streamBlockedStatus marks, in a KindStreamAck's status field, a sender waiting for
// window: the receiver acks what it consumed at once, and the next it consumes.
const streamBlockedStatus = 1

// ackDueLocked returns how many consumed bytes are worth an ack of their own now: a
// quarter of the window, or any while the peer waits for window. s.mu is held.
func (s *Stream) ackDueLocked() int64 {
	if n := s.consumed - s.acked; n >= int64(s.window/4) || n > 0 && s.peerBlocked {
		return s.takeAckLocked()
	}
	return 0
}

// takeAckLocked takes what was consumed and not yet acknowledged, for an ack about to be
// sent (alone or riding a message): at most what the ack's u32 field holds. s.mu is held.
func (s *Stream) takeAckLocked() int64 {
	if s.closed {
		return 0
	}
	n := min(s.consumed-s.acked, math.MaxUint32)
	if n > 0 {
		s.acked += n
		s.peerBlocked = false
	}
	return n
}

// sendAck sends a KindStreamAck: consumed bytes, the window granted when not zero, and
// status (streamBlockedStatus: this side waits for window). Without a credit now, the
// poller sends it when one returns.
func (s *Stream) sendAck(consumed int64, window int, status uint16) {
	if consumed == 0 && window == 0 && status == 0 {
		return
	}
	var p [wire.StreamAckLen]byte
	binary.LittleEndian.PutUint32(p[0:], uint32(consumed))
	binary.LittleEndian.PutUint32(p[4:], uint32(window))
	h := s.header(wire.KindStreamAck)
	h.Status = status
	s.c.hot.streamAcks.Add(1)
	if _, err := s.c.send(bg, &h, p[:], nil, revoke{}, sendTry); errors.Is(err, errNoCredit) {
		s.c.queueCtrl(h, revoke{}, string(p[:]))
	}
}

// waitLocked waits, with s.mu held (and released meanwhile), until *wake (s.recvWake or
// s.sendWake) is closed or ctx ends.
func (s *Stream) waitLocked(ctx context.Context, wake *chan struct{}) error {
	if *wake == nil {
		*wake = make(chan struct{})
	}
	ch := *wake
	s.mu.Unlock()
	var err error
	select {
	case <-ch:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	return err
}

// wakeLocked wakes what waits on *wake; s.mu is held.
func wakeLocked(wake *chan struct{}) {
	if *wake != nil {
		close(*wake)
		*wake = nil
	}
}

// wakeAllLocked wakes both sides: the stream ended or failed. s.mu is held.
func (s *Stream) wakeAllLocked() {
	wakeLocked(&s.recvWake)
	wakeLocked(&s.sendWake)
}

// push queues a received message; false means the peer sent past its window.
func (s *Stream) push(m *streamMsg, n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gotEnd { // nothing follows the peer's end
		m.release()
		return false
	}
	if m.end {
		s.gotEnd = true
	} else {
		if _, ok := s.admitLocked(n); !ok {
			m.release()
			return false
		}
	}
	if m.end && s.caller {
		s.peerEnded = true // sending is over, though Recv has not reached the end yet
		wakeLocked(&s.sendWake)
	}
	if s.closed {
		m.release()
		return true
	}
	s.q = append(s.q, m)
	wakeLocked(&s.recvWake)
	return true
}

// admitLocked counts a received message of n bytes against this side's window and
// returns what it costs; false means the peer sent past the window. The sender may have a
// window's worth outstanding, or one message of any size when nothing is: what this side
// has not acknowledged is at most what it has outstanding. s.mu is held.
func (s *Stream) admitLocked(n int) (cost int64, ok bool) {
	cost = int64(n + msgCost)
	if prev := s.received - s.acked; prev > 0 && prev+cost > int64(s.window) {
		return 0, false
	}
	s.received += cost
	return cost, true
}

// deliverInto copies an eager message straight into the buffer a waiting RecvInto
// offers, when nothing is queued before it and it fits: taken and consumed at once, it
// needs no pool buffer and no queue entry. false: the message goes the usual way (push);
// overrun: the peer sent past the window.
func (s *Stream) deliverInto(payload []byte) (ok, overrun bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.into == nil || len(payload) > len(s.into) || len(s.q) > 0 || s.closed || s.gotEnd {
		return false, false
	}
	cost, ok := s.admitLocked(len(payload))
	if !ok {
		return false, true
	}
	s.consumed += cost
	s.intoN = parcopy.CopyLarge(s.into, payload)
	s.into = nil
	s.hdrSet = true // a message came first: no header precedes it
	wakeLocked(&s.recvWake)
	return true, false
}

// fill completes a message whose READ was pending; after Close its buffer goes back.
func (s *Stream) fill(m *streamMsg, buf *pool.Buf) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		buf.Release()
		return
	}
	m.buf, m.data, m.ready = buf, buf.Bytes(), true
	wakeLocked(&s.recvWake)
}

// onAck takes the peer's ack: consumed bytes, and its window when not zero. false means
// the peer acknowledged more than was sent.
func (s *Stream) onAck(consumed int64, window int) bool {
	if consumed == 0 && window == 0 {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peerConsumed += consumed
	if s.peerConsumed > s.sent {
		return false
	}
	if consumed > 0 {
		s.saidBlocked = false // if still short of window, the next wait says so again
	}
	if window != 0 {
		s.peerWindow = min(max(window, minStreamWindow), maxStreamWindow)
	}
	wakeLocked(&s.sendWake)
	return true
}

// onPeerBlocked takes the peer's word that it waits for window: what this side consumed
// is acked now (by the poller, which never waits for a credit), and what it consumes
// next as soon as its reader releases it.
func (s *Stream) onPeerBlocked() {
	s.mu.Lock()
	s.peerBlocked = true
	ack := s.ackDueLocked()
	s.mu.Unlock()
	if ack > 0 {
		var p [wire.StreamAckLen]byte
		binary.LittleEndian.PutUint32(p[0:], uint32(ack))
		s.c.hot.streamAcks.Add(1)
		s.c.queueCtrl(s.header(wire.KindStreamAck), revoke{}, string(p[:]))
	}
}

// copyOut copies a received payload out of its receive slot into a pool buffer; with
// none to spare now, into the heap if heap is set (a stream's final response), else it
// fails: a stream's messages are bounded by its window, but not the number of streams.
func (c *Conn) copyOut(p []byte, heap bool) (*streamMsg, error) {
	m := &streamMsg{ready: true}
	if len(p) == 0 {
		return m, nil
	}
	b, err := c.t.pool.TryGet(len(p))
	if err == nil {
		c.CopyIn(b.Bytes(), p)
		m.buf, m.data = b, b.Bytes()
		return m, nil
	}
	if heap {
		m.data = bytes.Clone(p)
		return m, nil
	}
	return nil, err
}

// streamFor finds the stream a stream message or ack is for: one the peer opened (it
// says so with FlagCaller) or one this side did. nil: it ended.
func (c *Conn) streamFor(h *wire.Header) *Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.Flags&wire.FlagCaller != 0 {
		return c.serving.streams[h.CallID]
	}
	if cl := c.calls.lookupLocked(h.CallID); cl != nil {
		return cl.st
	}
	return nil
}

// openInStream records a stream the peer opens, as soon as its request's header arrives
// (a large request is READ first, and the stream's messages may overtake it), and grants
// it this side's window.
func (c *Conn) openInStream(h *wire.Header) bool {
	c.t.counters.streams.Add(1)
	st := newStream(c, h.CallID, false, min(max(int(h.Status)<<10, minStreamWindow), maxStreamWindow))
	c.mu.Lock()
	if c.serving.streams == nil {
		c.serving.streams = make(map[uint64]*Stream)
	}
	if c.serving.streams[h.CallID] != nil || c.serving.calls.get(h.CallID) != nil {
		c.mu.Unlock()
		c.fail(fmt.Errorf("%w: it sent a bad message: it opened stream %d, which is open", ErrProtocol, h.CallID))
		return false
	}
	c.serving.streams[h.CallID] = st
	c.mu.Unlock()
	var p [wire.StreamAckLen]byte
	binary.LittleEndian.PutUint32(p[4:], uint32(c.t.cfg.StreamWindow))
	c.hot.streamAcks.Add(1)
	c.queueCtrl(st.header(wire.KindStreamAck), revoke{}, string(p[:]))
	return true
}

// dropInStream forgets a stream the peer opened, once its handler is done or it was
// refused, and releases what it holds.
func (c *Conn) dropInStream(id uint64) {
	c.mu.Lock()
	st := c.serving.streams[id]
	delete(c.serving.streams, id)
	c.mu.Unlock()
	if st != nil {
		st.mu.Lock()
		st.closeLocked(ErrStreamEnded)
		st.mu.Unlock()
	}
}

// onStreamMsg takes an eager stream message or ack.
func (c *Conn) onStreamMsg(h *wire.Header, payload []byte) {
	st := c.streamFor(h)
	if st == nil {
		return // the stream ended: the late message is dropped
	}
	consumed, window := int64(h.RKey), 0 // an ack riding a stream message
	if h.Kind == wire.KindStreamAck {
		consumed = int64(binary.LittleEndian.Uint32(payload[0:]))
		window = int(binary.LittleEndian.Uint32(payload[4:]))
	}
	if !st.onAck(consumed, window) {
		c.fail(fmt.Errorf("%w: it sent a bad message: it acknowledged more of stream %d than was sent", ErrProtocol, h.CallID))
		return
	}
	if h.Kind == wire.KindStreamAck {
		if h.Status == streamBlockedStatus {
			st.onPeerBlocked()
		}
		return
	}
	if h.Flags&wire.FlagEnd != 0 {
		if !st.push(&streamMsg{ready: true, end: true}, 0) {
			c.streamOverrun(h)
		}
		return
	}
	header := h.Status == streamHeaderStatus
	if !header {
		switch ok, overrun := st.deliverInto(payload); {
		case overrun:
			c.streamOverrun(h)
			return
		case ok:
			return
		}
	}
	m, err := c.copyOut(payload, false)
	if err != nil {
		c.refuseStreamMsg(st, nil, h, err)
		return
	}
	m.header = header
	if !st.push(m, len(payload)) {
		c.streamOverrun(h)
	}
}

// streamOverrun fails a connection whose peer sent past a stream's window, or after its
// end.
func (c *Conn) streamOverrun(h *wire.Header) {
	c.fail(fmt.Errorf("%w: it sent a bad message: it sent past the window of stream %d (Config.StreamWindow %d), or after its end", ErrProtocol, h.CallID, c.t.cfg.StreamWindow))
}

// startStreamRead queues the entry a large stream message's READ fills; false means the
// stream ended (the window is revoked unread) or the peer overran it.
func (c *Conn) startStreamRead(h *wire.Header) (*Stream, *streamMsg, bool) {
	st := c.streamFor(h)
	if st == nil {
		c.queueInv(h.RKey, time.Now())
		return nil, nil, false
	}
	m := &streamMsg{header: h.Status == streamHeaderStatus}
	if !st.push(m, int(h.Len)) {
		c.queueInv(h.RKey, time.Now())
		c.streamOverrun(h)
		return nil, nil, false
	}
	return st, m, true
}

// refuseStreamMsg ends a stream whose message this side cannot take now (no pool buffer):
// its window, if large, is revoked unread, the entry queued for it (m) dropped, and the
// stream canceled on both sides.
func (c *Conn) refuseStreamMsg(st *Stream, m *streamMsg, h *wire.Header, why error) {
	if h.Flags&wire.FlagLarge != 0 {
		c.queueInv(h.RKey, time.Now())
	}
	err := fmt.Errorf("mwrpc: no registered memory for a stream message of %d bytes: %w", h.Len, why)
	st.mu.Lock()
	for i, q := range st.q { // the entry never fills: out of the queue
		if q == m {
			st.q = append(st.q[:i], st.q[i+1:]...)
			break
		}
	}
	st.mu.Unlock()
	st.fail(err)
	if st.caller {
		if c.forgetCall(st.cl) {
			c.queueCtrl(wire.Header{Kind: wire.KindCancel, CallID: st.id}, revoke{})
		}
		return
	}
	c.mu.Lock()
	sc := c.serving.calls.get(st.id)
	c.mu.Unlock()
	if sc != nil {
		sc.ctx.cancel(err)
	}
}
