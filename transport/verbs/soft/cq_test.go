package soft

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestCQResize: a queue grown while it holds completions that wrap around its ring keeps
// them in order and takes more; it refuses sizes below what is queued or beyond the
// device's MaxCQE, and a destroyed queue.
func TestCQResize(t *testing.T) {
	d := mustOpen(t)
	defer d.Close()
	q, err := d.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	c := q.(*cq)
	wcs := make([]verbs.WorkCompletion, 8)
	for i := uint64(0); i < 3; i++ { // head moves to 3: the next pushes wrap
		c.push(verbs.WorkCompletion{WRID: i})
	}
	if n, _ := c.Poll(wcs); n != 3 {
		t.Fatalf("polled %d, want 3", n)
	}
	for i := uint64(10); i < 13; i++ {
		c.push(verbs.WorkCompletion{WRID: i})
	}
	for _, tc := range []struct {
		cqe  int
		want error
	}{{0, verbs.ErrInvalid}, {2, verbs.ErrInvalid}, {maxCQE + 1, verbs.ErrInvalid}, {3, nil}, {9, nil}} {
		if err := verbs.ResizeCQ(q, tc.cqe); !errors.Is(err, tc.want) {
			t.Errorf("resize to %d: %v, want %v", tc.cqe, err, tc.want)
		}
	}
	if q.Cap() != 9 {
		t.Fatalf("Cap %d after resize to 9", q.Cap())
	}
	for i := uint64(13); i < 19; i++ { // 3 queued + 6 = 9: full, no overrun
		c.push(verbs.WorkCompletion{WRID: i})
	}
	n, err := c.Poll(wcs[:8])
	m, err2 := c.Poll(wcs[8:])
	if err != nil || err2 != nil || n+m != 8 {
		t.Fatalf("polled %d and %d (%v, %v), want 8", n, m, err, err2)
	}
	for i, wc := range wcs[:8] {
		if wc.WRID != uint64(10+i) {
			t.Fatalf("completion %d is %d, want %d (order lost)", i, wc.WRID, 10+i)
		}
	}
	if n, err := c.Poll(wcs); n != 1 || err != nil || wcs[0].WRID != 18 {
		t.Fatalf("last poll: %d %v %d", n, err, wcs[0].WRID)
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := verbs.ResizeCQ(q, 16); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("resize after destroy: %v, want ErrClosed", err)
	}
}

// TestArmedNotificationNeverLost: an armed completion pushed while readers begin and end
// their deliveries on other goroutines is announced exactly once: by the handler, run by
// the first reader that ends after it, or on Notify when no reader was delivering. The
// readers' bracket takes no lock, so this races them against push on purpose.
func TestArmedNotificationNeverLost(t *testing.T) {
	d := mustOpen(t)
	defer d.Close()
	q, err := d.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { must(t, q.Destroy()) }()
	c := q.(*cq)
	var ran atomic.Int32
	c.SetArmedHandler(func() { ran.Add(1) })
	wcs := make([]verbs.WorkCompletion, 4)
	rounds := 20000
	if testing.Short() {
		rounds = 2000
	}
	byHandler, bySignal := 0, 0
	for i := range rounds {
		must(t, c.ReqNotify())
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				c.beginDefer()
				for range i % 7 { // end at different times against the push
					runtime.Gosched()
				}
				c.endDefer()
			})
		}
		wg.Go(func() {
			for range i % 3 {
				runtime.Gosched()
			}
			c.push(verbs.WorkCompletion{WRID: uint64(i)})
		})
		wg.Wait()
		signaled := false
		select {
		case <-c.Notify():
			signaled = true
		default:
		}
		handled := ran.Swap(0)
		switch {
		case handled == 1 && !signaled:
			byHandler++
		case handled == 0 && signaled:
			bySignal++
		default:
			t.Fatalf("round %d: the handler ran %d times and Notify signaled %v, want one announcement", i, handled, signaled)
		}
		if n, _ := c.Poll(wcs); n != 1 {
			t.Fatalf("round %d: polled %d completions, want 1", i, n)
		}
		if v := c.defers.Load(); v != 0 {
			t.Fatalf("round %d: defers %#x after every reader ended, want 0", i, v)
		}
	}
	t.Logf("%d rounds: %d announced by a reader's handler, %d on Notify", rounds, byHandler, bySignal)
}
