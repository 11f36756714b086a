package mwnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/credentials"
)

// maxChunk bounds one stream message: a large Write goes as several messages, so the
// peer READs the first while the next is copied into registered memory.
const maxChunk = 1 << 20

// ErrWriteClosed is returned by a Write after CloseWrite.
var ErrWriteClosed = errors.New("mwnet: write after CloseWrite")

// ErrRefused is returned by a dialer's Read when the listener refused its stream (its
// backlog was full, or it was closed).
var ErrRefused = errors.New("stream refused by the listener")

// Conn is a net.Conn over one transport stream on its own queue pair. Read and Write may
// run at once from two goroutines; several Reads (or Writes) at once are serialized.
type Conn struct {
	st     *transport.Stream
	qp     *transport.Conn // the dialing side's connection (nil on the listener's)
	opener bool            // the dialing side: CloseWrite is the stream's CloseSend
	local  net.Addr
	remote net.Addr
	auth   credentials.AuthInfo

	stopAll context.CancelFunc // Close: every Read and Write waiting ends
	rd, wd  *deadline

	rmu     sync.Mutex
	pending []byte // the rest of the message RecvInto returned last (valid until the next one)
	rerr    error  // io.EOF or the stream's failure: every later Read returns it

	wmu     sync.Mutex
	wclosed bool
	gather  gatherer // small Writes that come while another Write sends

	once     sync.Once
	closed   chan struct{} // closed when Close starts
	released chan struct{} // closed when Close has released the stream
	release  func() error  // what Close frees after the stream: the dialer's transport
}

func newConn(st *transport.Stream, opener bool, local net.Addr, peer transport.Peer) *Conn {
	base, stop := context.WithCancel(context.Background())
	remote := peer.Addr
	if remote == nil {
		remote = local
	}
	return &Conn{
		st: st, opener: opener, local: local, remote: remote, auth: peer.AuthInfo,
		stopAll: stop, rd: newDeadline(base), wd: newDeadline(base),
		closed: make(chan struct{}), released: make(chan struct{}),
	}
}

// Read reads what the peer wrote, in order. It returns io.EOF after the peer's
// CloseWrite or Close, once everything before it was read. A Read that waits offers p to
// the stream: a message that fits is copied into it once, straight out of its receive
// slot (transport.Stream.RecvInto).
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	for {
		if err := c.readable(); err != nil {
			return 0, err
		}
		ctx := c.rd.current()
		if ctx.Err() != nil {
			return 0, c.opError("read", ctx, ctx.Err())
		}
		n, rest, err := c.st.RecvInto(ctx, p)
		switch {
		case err != nil:
			return 0, c.readFailed(ctx, err)
		case n > 0 || len(rest) > 0:
			c.pending = rest // the rest of the message (valid until the next RecvInto)
			return n, nil
		case !c.opener:
			continue // the opener never sends an empty message: nothing to read
		default:
			c.rerr = io.EOF // the server's CloseWrite
		}
	}
}

func (c *Conn) readable() error {
	select {
	case <-c.closed:
		return c.opError("read", nil, net.ErrClosed)
	default:
		return c.rerr
	}
}

// readFailed keeps the stream's end or failure for every later Read; a deadline or Close
// is returned as such.
func (c *Conn) readFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, io.EOF) {
		return c.opError("read", ctx, err)
	}
	if errors.Is(err, io.EOF) {
		c.rerr = io.EOF
		if status, msg, ok := c.st.Final(); c.opener && ok && status != transport.StatusOK {
			// The listener refused or ended the stream with an error (backlog full, closed).
			c.rerr = c.opError("read", nil, fmt.Errorf("mwnet: %w: %s", ErrRefused, msg))
		}
		return c.rerr
	}
	c.rerr = c.opError("read", nil, err)
	return c.rerr
}

// Write sends p: in messages of at most 1 MiB (the peer's largest message, if smaller),
// each inside a SEND or through a window, waiting while the peer's stream window is full.
// A small Write that comes while another one sends is gathered with others into one
// message (gather.go); a Write alone goes out at once.
func (c *Conn) Write(p []byte) (int, error) {
	if b := c.gather.join(p, c.st.EagerLimit()); b != nil {
		<-b.done
		if b.err != nil {
			return 0, b.err
		}
		return len(p), nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.write(p)
	for b := c.gather.take(); b != nil; b = c.gather.take() {
		_, berr := c.write(b.buf)
		c.gather.sent(b, berr)
	}
	return n, err
}

// write sends p; c.wmu is held.
func (c *Conn) write(p []byte) (int, error) {
	if c.wclosed {
		return 0, c.opError("write", nil, ErrWriteClosed)
	}
	chunk := min(maxChunk, c.st.MaxSend())
	n := 0
	for n < len(p) {
		select {
		case <-c.closed:
			return n, c.opError("write", nil, net.ErrClosed)
		default:
		}
		ctx := c.wd.current()
		if ctx.Err() != nil {
			return n, c.opError("write", ctx, ctx.Err())
		}
		k := min(len(p)-n, chunk)
		if err := c.st.Send(ctx, p[n:n+k]); err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("mwnet: the peer closed the connection: %w", io.ErrClosedPipe)
			}
			return n, c.opError("write", ctx, err)
		}
		n += k
	}
	return n, nil
}

// CloseWrite ends this side's writing: the peer's Read returns io.EOF once it has read
// everything before. Reading goes on.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wclosed {
		return nil
	}
	c.wclosed = true
	ctx := c.wd.current()
	var err error
	if c.opener {
		err = c.st.CloseSend(ctx)
	} else {
		err = c.st.Send(ctx, nil) // an empty message: the opener's side reads it as the end
	}
	if err != nil {
		return c.opError("close", ctx, err)
	}
	return nil
}

// Close ends Reads and Writes in progress, ends the stream (the peer reads io.EOF, or an
// error for what it still writes) and releases the stream's buffers and, on the dialing
// side, its queue pair and transport.
func (c *Conn) Close() error {
	first := false
	c.once.Do(func() { first = true })
	if !first {
		<-c.released
		return c.opError("close", nil, net.ErrClosed)
	}
	close(c.closed)
	c.stopAll()
	c.rd.stop()
	c.wd.stop()
	c.rmu.Lock() // the Reads and Writes in progress end now
	c.wmu.Lock()
	c.pending = nil
	c.st.Close()
	c.wmu.Unlock()
	c.rmu.Unlock()
	var err error
	if c.release != nil {
		err = c.release()
	}
	close(c.released)
	return err
}

// LocalAddr returns this side's address: the listener's target, or the dialed target's
// fabric on the dialing side.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address as the fabric's bootstrap saw it.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// AuthInfo returns what the credentials' handshake established about the peer (a
// credentials.TLSInfo with TLS), or nil without credentials.
func (c *Conn) AuthInfo() credentials.AuthInfo { return c.auth }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

// SetReadDeadline sets the deadline for Reads, including one waiting now; the zero time
// means none. A Read past it returns an error whose Timeout() is true
// (os.ErrDeadlineExceeded).
func (c *Conn) SetReadDeadline(t time.Time) error { c.rd.set(t); return nil }

// SetWriteDeadline sets the deadline for Writes, including one waiting now. A Write past
// it may have sent part of its bytes: it returns how many.
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }

// opError wraps err as package net does; a deadline that passed or a Close that ended
// the call is reported as such.
func (c *Conn) opError(op string, ctx context.Context, err error) error {
	if ctx != nil && ctx.Err() != nil {
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, os.ErrDeadlineExceeded):
			err = os.ErrDeadlineExceeded
		default:
			err = net.ErrClosed
		}
	}
	return &net.OpError{Op: op, Net: network, Source: c.local, Addr: c.remote, Err: err}
}
