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
