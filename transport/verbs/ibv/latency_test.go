//go:build ibverbs && linux && cgo

package ibv_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// latRig is two connected RC QPs, A and B, on one device, each with its own CQs and 4 KiB
// of registered memory.
type latRig struct {
	dev      verbs.Device
	pd       verbs.PD
	qa, qb   verbs.QP
	sa, ra   verbs.CQ // A's send and receive CQs
	sb, rb   verbs.CQ
	ma, mb   verbs.MR
	released []func() error
}

func newLatRig(b testing.TB) *latRig {
	b.Helper()
	d := openOrSkip(b)
	r := &latRig{dev: d}
	b.Cleanup(func() {
		for i := len(r.released) - 1; i >= 0; i-- {
			if err := r.released[i](); err != nil {
				b.Errorf("teardown: %v", err)
			}
		}
		if err := d.Close(); err != nil {
			b.Errorf("close: %v", err)
		}
	})
	must := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	var err error
	r.pd, err = d.AllocPD()
	must(err)
	r.released = append(r.released, r.pd.Dealloc)
	cq := func() verbs.CQ {
		c, err := d.CreateCQ(256)
		must(err)
		r.released = append(r.released, c.Destroy)
		return c
	}
	r.sa, r.ra, r.sb, r.rb = cq(), cq(), cq(), cq()
	mr := func() verbs.MR {
		m, err := verbs.Map(4096, verbs.MapOptions{})
		must(err)
		r.released = append(r.released, m.Unmap)
		x, err := r.pd.RegMR(m.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
		must(err)
		r.released = append(r.released, x.Dereg)
		return x
	}
	r.ma, r.mb = mr(), mr()
	qp := func(s, rc verbs.CQ) verbs.QP {
		q, err := r.pd.CreateQP(verbs.QPInitAttr{SendCQ: s, RecvCQ: rc,
			Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
		must(err)
		r.released = append(r.released, q.Destroy)
		return q
	}
	r.qa, r.qb = qp(r.sa, r.ra), qp(r.sb, r.rb)
	must(connectPair(r.qa, r.qb))
	return r
}

// connectPair connects a and b with cm.Connect over a loopback TCP connection.
func connectPair(a, b verbs.QP) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errb := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errb <- err
			return
		}
		defer c.Close()
		_, err = cm.Connect(ctx, c, b, cm.DefaultParams())
		errb <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = cm.Connect(ctx, c, a, cm.DefaultParams())
	if e := <-errb; err == nil {
		err = e
	}
	return err
}

// spin polls cq until one completion arrives and checks it; poll is its form for other
// goroutines, which must not call Fatal.
func spin(tb testing.TB, cq verbs.CQ, wc []verbs.WorkCompletion) {
	tb.Helper()
	if err := poll(cq, wc, nil); err != nil {
		tb.Fatal(err)
	}
}

// errStopped ends a poll whose stop flag was set.
var errStopped = errors.New("stopped")

func poll(cq verbs.CQ, wc []verbs.WorkCompletion, stop *atomic.Bool) error {
	for {
		if stop != nil && stop.Load() {
			return errStopped
		}
		n, err := cq.Poll(wc[:1])
		if err != nil {
			return err
		}
		if n == 1 {
			if wc[0].Status != verbs.WCSuccess {
				return fmt.Errorf("completion %v", wc[0])
			}
			return nil
		}
	}
}

// timer records the time of each operation the way perftest does (one timestamp per
// operation, the median is typical). Reading the clock is not free here (the test VM's
// clock source is an emulated HPET: a system call and microseconds), so its cost, measured
// first, is subtracted from every interval, each of which contains one clock read.
type timer struct {
	last  time.Time
	per   []time.Duration
	clock time.Duration
}

func newTimer(n int) *timer {
	const k = 200
	d := make([]time.Duration, 0, k)
	prev := time.Now()
	for range k {
		now := time.Now()
		d = append(d, now.Sub(prev))
		prev = now
	}
	slices.Sort(d)
	return &timer{per: make([]time.Duration, 0, n), clock: d[k/2]}
}

func (t *timer) start() { t.last = time.Now() }

// op marks the end of one operation and the start of the next.
func (t *timer) op() {
	now := time.Now()
	t.per = append(t.per, max(now.Sub(t.last)-t.clock, 0))
	t.last = now
}

// report adds the median and mean time of an operation, in microseconds (perftest's
// t_typical and t_avg), and the clock cost subtracted.
func (t *timer) report(b *testing.B) {
	if len(t.per) == 0 {
		return
	}
	var sum time.Duration
	for _, d := range t.per {
		sum += d
	}
	slices.Sort(t.per)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ReportMetric(us(t.per[len(t.per)/2]), "typ-us")
	b.ReportMetric(us(sum)/float64(len(t.per)), "avg-us")
	b.ReportMetric(us(t.per[0]), "min-us")
	b.ReportMetric(us(t.clock), "clock-us")
}

// BenchmarkLatency measures round trips of this provider between two QPs of one process:
// read64 is one 64-byte RDMA READ (post, busy-poll its completion), like perftest's
// ib_read_lat; send64 is a 64-byte SEND from A to B and one back (not inline: perftest
// does not inline on rxe), B answering on its own goroutine and thread as perftest's
// server process does, so its half is what ib_send_lat reports. Run with
// -test.benchtime=Nx; typ-us, avg-us and min-us are the median, mean and least time of one
// operation, less the cost of reading the clock (clock-us).
func BenchmarkLatency(b *testing.B) {
	b.Run("read64", func(b *testing.B) {
		r := newLatRig(b)
		wc := make([]verbs.WorkCompletion, 1)
		wr := []verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEFor(r.ma, 0, 64)}, RemoteAddr: r.mb.Addr(), RKey: r.mb.RKey()}}
		t := newTimer(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		t.start()
		for range b.N {
			if err := r.qa.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			spin(b, r.sa, wc)
			t.op()
		}
		b.StopTimer()
		t.report(b)
	})
	b.Run("send64", func(b *testing.B) {
		r := newLatRig(b)
		ra := []verbs.RecvWR{{WRID: 10, SGL: []verbs.SGE{verbs.SGEFor(r.ma, 1024, 64)}}}
		rb := []verbs.RecvWR{{WRID: 20, SGL: []verbs.SGE{verbs.SGEFor(r.mb, 1024, 64)}}}
		sa := []verbs.SendWR{{WRID: 11, Opcode: verbs.WRSend, SGL: []verbs.SGE{verbs.SGEFor(r.ma, 0, 64)}}}
		sb := []verbs.SendWR{{WRID: 21, Opcode: verbs.WRSend, SGL: []verbs.SGE{verbs.SGEFor(r.mb, 0, 64)}}}
		var stop atomic.Bool
		// One side's turn: SEND (one in 16 signaled, so that the send queue drains) and
		// wait for the peer's, or the other way round; then post the receive again.
		step := func(q verbs.QP, w []verbs.SendWR, scq, rcq verbs.CQ, rv []verbs.RecvWR, wc []verbs.WorkCompletion, i int, first bool) error {
			w[0].Flags = 0
			if i%16 == 15 {
				w[0].Flags = verbs.SendSignaled
			}
			if first {
				if err := q.PostSend(w); err != nil {
					return err
				}
			}
			if err := poll(rcq, wc, &stop); err != nil {
				return err
			}
			if err := q.PostRecv(rv); err != nil {
				return err
			}
			if !first {
				if err := q.PostSend(w); err != nil {
					return err
				}
			}
			if i%16 == 15 {
				return poll(scq, wc, &stop)
			}
			return nil
		}
		for _, p := range []struct {
			q verbs.QP
			w []verbs.RecvWR
		}{{r.qa, ra}, {r.qb, rb}} {
			if err := p.q.PostRecv(p.w); err != nil {
				b.Fatal(err)
			}
		}
		// B answers on its own goroutine and thread, as perftest's server process does.
		n := b.N
		var errB error
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			wc := make([]verbs.WorkCompletion, 1)
			for i := range n {
				if err := step(r.qb, sb, r.sb, r.rb, rb, wc, i, false); err != nil {
					if err != errStopped {
						errB = err
						stop.Store(true)
					}
					return
				}
			}
		}()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		wc := make([]verbs.WorkCompletion, 1)
		t := newTimer(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		t.start()
		for i := range b.N {
			if err := step(r.qa, sa, r.sa, r.ra, ra, wc, i, true); err != nil {
				stop.Store(true)
				<-done
				b.Fatalf("A: %v (B: %v)", err, errB)
			}
			t.op()
		}
		b.StopTimer()
		<-done
		if errB != nil {
			b.Fatalf("B: %v", errB)
		}
		t.report(b)
	})
}

// TestNoAllocs checks that the data path does not allocate: PostSend, PostRecv and Poll.
func TestNoAllocs(t *testing.T) {
	r := newLatRig(t)
	wc := make([]verbs.WorkCompletion, 4)
	rd := []verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEFor(r.ma, 0, 64)}, RemoteAddr: r.mb.Addr(), RKey: r.mb.RKey()}}
	sd := []verbs.SendWR{{WRID: 2, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled | verbs.SendInline, ImmData: 7,
		SGL: []verbs.SGE{verbs.SGEFor(r.ma, 128, 32)}}}
	rv := []verbs.RecvWR{{WRID: 3, SGL: []verbs.SGE{verbs.SGEFor(r.mb, 1024, 64)}}}
	n := testing.AllocsPerRun(200, func() {
		if err := r.qa.PostSend(rd); err != nil {
			t.Fatal(err)
		}
		spin(t, r.sa, wc)
		if err := r.qb.PostRecv(rv); err != nil {
			t.Fatal(err)
		}
		if err := r.qa.PostSend(sd); err != nil {
			t.Fatal(err)
		}
		spin(t, r.sa, wc)
		spin(t, r.rb, wc)
		if k, err := r.ra.Poll(wc); k != 0 || err != nil {
			t.Fatalf("poll of an empty CQ: %d, %v", k, err)
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per READ, SEND_WITH_IMM, receive and polls; want 0", n)
	}
}

// BenchmarkPollEmpty measures the provider's cost of one Poll of an empty CQ: one cgo
// call into ibv_poll_cq.
func BenchmarkPollEmpty(b *testing.B) {
	r := newLatRig(b)
	wc := make([]verbs.WorkCompletion, 16)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if n, err := r.ra.Poll(wc); n != 0 || err != nil {
			b.Fatal(n, err)
		}
	}
}
