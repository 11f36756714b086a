package soft

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// directWrites reports whether a poster writes a large frame of up to tryTxMax bytes
// itself with a writev that never waits (tcpLink.sendNow).
const directWrites = true

// iovecs is sendNow's writev(2) vector: a large frame is a header, its padding and the
// payload's segments (a work request has a few SGEs).
type iovecs [8]unix.Iovec

// tryWritev is sendNow's one attempt at the raw socket: one writev(2) of tryVec that never
// waits for it. The vector lives in the link (unix.Writev would allocate one per call).
func (l *tcpLink) tryWritev(fd uintptr) bool {
	if len(l.tryVec) > len(l.iov) {
		l.tryN, l.tryErr = unix.Writev(int(fd), l.tryVec)
		return true
	}
	n := 0
	for _, b := range l.tryVec {
		if len(b) == 0 {
			continue
		}
		l.iov[n] = unix.Iovec{Base: &b[0]}
		l.iov[n].SetLen(len(b))
		n++
	}
	r, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&l.iov[0])), uintptr(n))
	clear(l.iov[:n]) // drop references to registered memory
	l.tryN, l.tryErr = int(r), nil
	if e != 0 {
		l.tryN, l.tryErr = 0, e
	}
	return true
}
