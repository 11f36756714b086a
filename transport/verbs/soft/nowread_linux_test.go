//go:build linux

package soft

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestPayloadBeforeReap checks connSource.fill on a TCP link: the payload bytes the socket
// already holds are read before the reader lets its deferred CQ notification go (the CQ
// handler, the poller's reap, would hold them up), and the notification still goes before
// a read that waits (a payload that has not arrived).
func TestPayloadBeforeReap(t *testing.T) {
	for _, tc := range []struct {
		name        string
		late        int  // payload bytes the peer writes only after the handler ran (or 2 s)
		wantHandler bool // the handler ran inside fill
	}{
		{"whole payload in the socket", 0, false},
		{"the payload's tail comes later", 1000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w := tcpPair(t)
			raw, err := r.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			payload := bytes.Repeat([]byte("0123456789abcdef"), 16<<10/16)
			const ahead = 100 // read ahead with the header
			c := &cq{dev: &Device{}, ring: make([]verbs.WorkCompletion, 4), notify: make(chan struct{}, 1)}
			c.size.Store(4)
			ran := make(chan struct{})
			var handled atomic.Bool
			c.SetArmedHandler(func() {
				if !handled.Swap(true) {
					close(ran)
				}
			})
			must(t, c.ReqNotify())
			c.beginDefer() // the reader delivers a frame...
			c.push(verbs.WorkCompletion{WRID: 7})
			q := &QP{rcq: c, scq: c, st: &stats{}}

			if _, err := w.Write(payload[ahead : len(payload)-tc.late]); err != nil {
				t.Fatal(err)
			}
			go func() {
				if tc.late == 0 {
					return
				}
				select {
				case <-ran:
				case <-time.After(2 * time.Second):
				}
				_, _ = w.Write(payload[len(payload)-tc.late:])
			}()
			waitReadable(t, raw, len(payload)-ahead-tc.late)

			fr := &frameReader{rb: append([]byte(nil), payload[:ahead]...), have: ahead}
			src := &connSource{fr: fr, r: r, now: &nowReader{raw: raw}, left: int64(len(payload))}
			dst := make([]byte, len(payload))
			if err := src.fill(q, dst); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, payload) {
				t.Fatal("the payload read is not the one written")
			}
			if got := handled.Load(); got != tc.wantHandler {
				t.Fatalf("the CQ handler ran inside fill: %v, want %v", got, tc.wantHandler)
			}
			c.endDefer() // ...and lets the notification go once delivered
			if !handled.Load() {
				t.Fatal("the deferred notification never reached the handler")
			}
		})
	}
}

// waitReadable waits until the socket behind raw holds at least n bytes, so that a read that
// never waits finds them all.
func waitReadable(t *testing.T, raw interface {
	Control(func(uintptr)) error
}, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for socketHolds(t, raw) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the socket holds %d bytes after 5 s, want %d", socketHolds(t, raw), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// socketHolds returns how many bytes the socket behind raw holds (FIONREAD).
func socketHolds(t *testing.T, raw interface {
	Control(func(uintptr)) error
}) int {
	t.Helper()
	var n int
	var ierr error
	if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
		t.Fatalf("FIONREAD: %v %v", err, ierr)
	}
	return n
}
