//go:build unix

package soft

import "syscall"

// rawWrites reports whether a link on a plain TCP stream writes from a stream reader with
// a write that never waits (tcpLink.tryFlush). On Unix the runtime keeps sockets
// non-blocking, so one write(2) on the descriptor takes what the socket has room for and
// fails with EAGAIN for the rest.
const rawWrites = true

// tryWrite is tryFlush's one attempt at the raw socket: it never waits for it.
func (l *tcpLink) tryWrite(fd uintptr) bool {
	l.tryN, l.tryErr = syscall.Write(int(fd), l.tryBuf)
	return true
}

// nowReader reads what a socket holds without waiting: one read(2) on the descriptor, which
// the runtime keeps non-blocking. It is the stream reader's own (its fields are not the
// writers' tryN and tryErr).
type nowReader struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool
	buf []byte
	n   int
}

// read reads into p what the socket holds, and returns how much: 0 when it holds nothing,
// and on an error or the end of the stream, which the next read that may wait reports. A
// nil nowReader reads nothing.
func (r *nowReader) read(p []byte) int {
	if r == nil || len(p) == 0 {
		return 0
	}
	if r.fn == nil {
		r.fn = r.readOnce // one closure for the link's life, not one per read
	}
	r.buf, r.n = p, 0
	err := r.raw.Read(r.fn)
	r.buf = nil
	if err != nil {
		return 0
	}
	return r.n
}

// readOnce is read's one attempt: it never asks the runtime to wait for the socket.
func (r *nowReader) readOnce(fd uintptr) bool {
	if n, err := syscall.Read(int(fd), r.buf); err == nil && n > 0 {
		r.n = n
	}
	return true
}
