package soft

import (
	"net"
	"syscall"
	"testing"
)

// TestStreamSendBuffer: a TCP stream attached to a QP gets a bounded send buffer
// (streamSendBuffer), not Linux's autotuned megabytes.
func TestStreamSendBuffer(t *testing.T) {
	a, b := newHost(t, mustOpen(t), 1<<16), newHost(t, mustOpen(t), 1<<16)
	defer a.close(t)
	defer b.close(t)
	var tc *net.TCPConn
	connectVia(t, a, b, func(c net.Conn) net.Conn { tc = c.(*net.TCPConn); return c })
	raw, err := tc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var serr error
	if err := raw.Control(func(fd uintptr) { n, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	// Linux reports twice what was set (its bookkeeping); left alone, a loopback stream has
	// megabytes (4 MiB here).
	if n < streamSendBuffer || n > 2*streamSendBuffer {
		t.Fatalf("SO_SNDBUF = %d, want %d (or twice that)", n, streamSendBuffer)
	}
}
