package cm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
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
		{"version", "version 2", append(append([]byte{}, good[:4]...), append([]byte{2, 0}, good[6:]...)...)},
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

// newQP returns a fresh RC QP on a soft TCP-fabric device, released at cleanup.
func newQP(t *testing.T) verbs.QP {
	t.Helper()
	dev, _ := soft.OpenTCP("cm")
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, err := range []error{qp.Destroy(), cq.Destroy(), pd.Dealloc(), dev.Close()} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	return qp
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
