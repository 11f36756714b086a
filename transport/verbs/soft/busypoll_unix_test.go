//go:build unix

package soft

import (
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/idle"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestBusyPoll: a stream reader whose process is quiet polls its socket for the next frame
// after a small one, and finds frames that way (Stats.BusyPolled); it never does with busy
// polling off (the default), nor while the process is busy, and after a large frame only
// at a fresh link's first wait or after a small frame between large ones.
func TestBusyPoll(t *testing.T) {
	for _, tc := range []struct {
		name       string
		quiet      bool
		budget     int64 // SetBusyPoll's argument, in microseconds: long enough for a round trip of this test on a loaded 2-core machine
		size       int
		wantPolled bool
	}{
		{"quiet, small frames", true, 20000, 64, true},
		{"busy polling off by default", true, 0, 64, false},
		{"busy polling off", true, -1, 64, false},
		{"process busy", false, 20000, 64, false},
		{"large frames", true, 20000, 8 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer idle.ForceQuiet(tc.quiet)()
			c, s := newHost(t, mustOpenTCP(t, "c"), 1<<20), newHost(t, mustOpenTCP(t, "s"), 1<<20)
			defer c.close(t)
			defer s.close(t)
			for _, h := range []*host{c, s} {
				h.dev.SetBusyPoll(time.Duration(tc.budget) * time.Microsecond)
			}
			connect(t, c, s)
			pingPong(t, c, s, tc.size, 200)
			polled := c.dev.Stats().BusyPolled + s.dev.Stats().BusyPolled
			switch {
			case tc.wantPolled && polled == 0:
				t.Fatalf("no frame of 400 found by polling (Stats.BusyPolled 0)")
			case !tc.wantPolled && tc.size > busyPollFrameMax && polled > 2+400/20:
				// Each link's first wait, and the waits after a small frame between large ones
				// (an ACK the NIC sends alone on a loaded machine): a few of 400, where
				// polling after every frame finds most. That no wait after a large frame
				// polls at all is TestPollNextAfterLargeFrame's.
				t.Fatalf("%d of 400 frames found by polling after large frames, want at most each link's first and a few after a lone ACK", polled)
			case !tc.wantPolled && tc.size <= busyPollFrameMax && polled != 0:
				t.Fatalf("%d frames found by polling, want none", polled)
			}
			t.Logf("Stats.BusyPolled %d", polled)
		})
	}
}

func mustOpenTCP(t *testing.T, name string) *Device {
	t.Helper()
	d, err := OpenTCP(name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// pingPong sends n messages of size bytes from a to b, each answered by b before the next,
// reaping completions without ever parking (so the peer's answer comes soon).
func pingPong(t *testing.T, a, b *host, size, n int) {
	t.Helper()
	reap := func(h *host, want verbs.WCOpcode) {
		for {
			k, err := h.cq.Poll(h.wcs[:1])
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				runtime.Gosched()
				continue
			}
			if wc := h.wcs[0]; wc.Status != verbs.WCSuccess {
				t.Fatalf("completion %v", wc)
			} else if wc.Opcode == want {
				return
			}
		}
	}
	for i := range n {
		must(t, b.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(b.mr, 0, size)}}}))
		must(t, a.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(a.mr, 0, size)}}}))
		must(t, a.qp.PostSend([]verbs.SendWR{{WRID: uint64(i), Opcode: verbs.WRSend, SGL: []verbs.SGE{verbs.SGEFor(a.mr, size, size)}}}))
		reap(b, verbs.WCRecv)
		must(t, b.qp.PostSend([]verbs.SendWR{{WRID: uint64(i), Opcode: verbs.WRSend, SGL: []verbs.SGE{verbs.SGEFor(b.mr, size, size)}}}))
		reap(a, verbs.WCRecv)
	}
}

// TestPollNextAfterLargeFrame: a reader polls its socket for the next frame only after a
// small one (up to busyPollFrameMax) or none yet; after a larger one it parks at once, on
// any machine and however the frames were sent.
func TestPollNextAfterLargeFrame(t *testing.T) {
	defer idle.ForceQuiet(true)()
	r, w, err := os.Pipe() // empty: a poll finds nothing and ends with its budget
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	raw, err := r.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		last  uint32
		polls bool
	}{
		{0, true}, // a fresh link's first wait
		{64, true},
		{busyPollFrameMax, true},
		{busyPollFrameMax + 1, false},
		{8 << 10, false},
	} {
		var polled atomic.Uint64
		f := frameReader{rb: make([]byte, 64), lastLen: tc.last,
			poll: &busyPoll{now: nowReader{raw: raw}, spin: idle.NewSpinner(time.Microsecond), polled: &polled}}
		if _, began := f.pollNext(); began.IsZero() == tc.polls {
			t.Errorf("after a frame of %d bytes: polled %v, want %v", tc.last, !began.IsZero(), tc.polls)
		}
	}
}
