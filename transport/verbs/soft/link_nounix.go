//go:build !unix

package soft

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
)

// rawWrites reports whether a link on a plain TCP stream writes from a stream reader with
// a write that never waits (tcpLink.tryFlush). Not on this OS: Windows sockets are
// overlapped handles that the runtime writes through its I/O completion port, with no
// write that returns at once with what the socket took. Every frame there is the
// engine's to write, as on a TLS stream.
const rawWrites = false

// errNoRawWrites is tryWrite's failure, which tryFlush would return if it were reached.
var errNoRawWrites = fmt.Errorf("soft: writes that never wait are not on %s: %w", runtime.GOOS, errors.ErrUnsupported)

// tryWrite is never reached here: links have no raw socket (rawWrites is false).
func (l *tcpLink) tryWrite(uintptr) bool {
	l.tryN, l.tryErr = 0, errNoRawWrites
	return true
}

// nowReader would read what a socket holds without waiting; links here have no raw
// socket (rawWrites is false), so none is made and every payload read may wait.
type nowReader struct{ raw syscall.RawConn }

// read reads nothing: see nowReader.
func (r *nowReader) read([]byte) int { return 0 }
