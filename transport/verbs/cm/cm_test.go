package cm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/internal/qptest"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

func TestEndpointRoundTrip(t *testing.T) {
	e := verbs.Endpoint{QPN: 0x123456, PSN: 0xabcdef, LID: 7, GID: [16]byte{0xfe, 0x80, 15: 1}}
	b := AppendEndpoint(nil, e)
	got, rest, err := ParseEndpoint(append(b, 9))
	if err != nil || got != e || !bytes.Equal(rest, []byte{9}) {
		t.Fatalf("ParseEndpoint = %+v, %x, %v; want %+v", got, rest, err, e)
	}
}

func TestParseEndpointRejects(t *testing.T) {
	good := AppendEndpoint(nil, verbs.Endpoint{QPN: 1})
	for _, tc := range []struct {
		name, want string
		b          []byte
	}{
		{"short", "need 32", good[:31]},
		{"magic", "magic", append([]byte("HTTP"), good[4:]...)},
		{"version", "version 1", append(append([]byte{}, good[:4]...), append([]byte{1, 0}, good[6:]...)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseEndpoint(tc.b)
			if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrHandshake mentioning %q", err, tc.want)
			}
		})
	}
}

func FuzzParseEndpoint(f *testing.F) {
	f.Add(AppendEndpoint(nil, verbs.Endpoint{QPN: 17, PSN: 99, GID: [16]byte{1, 2, 3}}))
	f.Add([]byte("MWCM"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, rest, err := ParseEndpoint(b)
		if err != nil {
			return
		}
		if len(rest) != len(b)-msgLen || !bytes.Equal(AppendEndpoint(nil, e), b[:msgLen]) {
			t.Fatalf("accepted %x but does not re-encode to it", b[:msgLen])
		}
	})
}

// newQP returns a fresh RC QP on a soft TCP-fabric device (a stream QP), released at
// cleanup.
func newQP(t *testing.T) verbs.QP {
	t.Helper()
	dev, _ := soft.OpenTCP("cm")
	return qptest.New(t, dev)
}

// newFabricQPs returns two fresh RC QPs on two devices of an in-process fabric (not
// stream QPs: the ready markers are exchanged), released at cleanup.
func newFabricQPs(t *testing.T) (verbs.QP, verbs.QP) {
	t.Helper()
	f := soft.NewFabric()
	da, _ := f.Open("cm-a")
	db, _ := f.Open("cm-b")
	return qptest.New(t, da), qptest.New(t, db)
}

// TestConnectBadPeer: garbage, a wrong version, a peer that hangs up and a silent peer
// each fail with an error that says what went wrong, and the QP is not connected.
func TestConnectBadPeer(t *testing.T) {
	wrongVersion := AppendEndpoint(nil, verbs.Endpoint{QPN: 1})
	wrongVersion[4] = 9
	for _, tc := range []struct {
		name string
		peer func(c net.Conn)
		want string
		is   error
	}{
		{"garbage", func(c net.Conn) { c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n........")) }, "magic", ErrHandshake},
		{"version", func(c net.Conn) { c.Write(wrongVersion) }, "version 9", ErrHandshake},
		{"hangup", func(c net.Conn) { c.Write([]byte("MWCM")); c.Close() }, "read peer endpoint", nil},
		{"silent", func(c net.Conn) {}, "endpoint exchange", context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qp := newQP(t)
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go func() {
				buf := make([]byte, msgLen)
				b.Read(buf)
				tc.peer(b)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := Connect(ctx, a, qp, DefaultParams())
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("Connect = %v; want an error mentioning %q (is %v)", err, tc.want, tc.is)
			}
			if st := qp.State(); st == verbs.QPStateRTR || st == verbs.QPStateRTS {
				t.Fatalf("QP reached %v after a failed handshake", st)
			}
		})
	}
}

// fakePeer answers Connect on the other end of c as a version-2 peer with peer's endpoint
// would, up to the endpoint; what comes after is the case's.
func fakePeer(t *testing.T, c net.Conn, peer verbs.QP) {
	buf := make([]byte, msgLen)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Errorf("fake peer: read endpoint: %v", err)
		return
	}
	if _, err := c.Write(AppendEndpoint(nil, peer.Endpoint())); err != nil {
		t.Errorf("fake peer: write endpoint: %v", err)
	}
}

// TestConnectWaitsForPeerRTR: a QP that is not a stream QP announces RTR with a marker and
// reaches RTS only after the peer's marker, so it never sends to a QP that would drop it.
func TestConnectWaitsForPeerRTR(t *testing.T) {
	qp, peer := newFabricQPs(t)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	states := make(chan verbs.QPState, 2)
	go func() {
		fakePeer(t, b, peer)
		m := []byte{0}
		if _, err := io.ReadFull(b, m); err != nil || m[0] != readyMarker {
			t.Errorf("fake peer: ready marker %x, %v; want %q", m, err, readyMarker)
		}
		states <- qp.State() // its marker came once it was in RTR
		time.Sleep(50 * time.Millisecond)
		states <- qp.State() // and it waits for ours
		b.Write([]byte{readyMarker})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Connect(ctx, a, qp, DefaultParams())
	s1, s2 := <-states, <-states
	if err != nil {
		t.Fatal(err)
	}
	if s1 != verbs.QPStateRTR || s2 != verbs.QPStateRTR {
		t.Fatalf("QP was in %v when its marker arrived and %v before the peer's: want RTR both times", s1, s2)
	}
	if st := qp.State(); st != verbs.QPStateRTS {
		t.Fatalf("QP in %v after Connect, want RTS", st)
	}
}

// TestConnectBadReadyMarker: a wrong marker, or a peer that hangs up or falls silent before
// sending it, fails Connect with an error saying so, and the QP does not reach RTS.
func TestConnectBadReadyMarker(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(c net.Conn)
		want string
		is   error
	}{
		{"wrong", func(c net.Conn) { c.Write([]byte{'X'}) }, "ready marker is 0x58", ErrHandshake},
		{"hangup", func(c net.Conn) { c.Close() }, "read peer ready marker", nil},
		{"silent", func(c net.Conn) {}, "ready marker exchange", context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qp, peer := newFabricQPs(t)
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				fakePeer(t, b, peer)
				io.ReadFull(b, make([]byte, 1)) // our marker
				tc.peer(b)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err := Connect(ctx, a, qp, DefaultParams())
			a.Close()
			<-done
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("Connect = %v; want an error mentioning %q (is %v)", err, tc.want, tc.is)
			}
			if st := qp.State(); st == verbs.QPStateRTS {
				t.Fatal("QP reached RTS without the peer's ready marker")
			}
		})
	}
}
