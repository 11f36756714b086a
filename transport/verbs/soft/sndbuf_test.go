package soft

import (
	"net"
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
	if err := raw.Control(func(fd uintptr) { n, serr = sendBuffer(fd) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	// Linux reports twice what was set (its bookkeeping), macOS, the BSDs and Windows what
	// was set; left alone, a loopback stream on Linux has megabytes (4 MiB here).
	if n < streamSendBuffer || n > 2*streamSendBuffer {
		t.Fatalf("SO_SNDBUF = %d, want %d (or twice that)", n, streamSendBuffer)
	}
}
