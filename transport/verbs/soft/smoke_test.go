package soft

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// host is one side of a test connection: a device with a PD, a CQ, a QP (on an SRQ, for
// newSRQHost) and some memory.
type host struct {
	dev *Device
	pd  verbs.PD
	cq  verbs.CQ
	qp  verbs.QP
	srq verbs.SRQ
	mem *verbs.Memory
	mr  verbs.MR
	wcs [16]verbs.WorkCompletion
}

func newHost(t testing.TB, dev *Device, size int) *host {
	t.Helper()
	return newSRQHost(t, dev, size, 0)
}

// newSRQHost is newHost with the QP taking its receives from an SRQ of depth receives
// (depth 0: its own receive queue).
func newSRQHost(t testing.TB, dev *Device, size, depth int) *host {
	t.Helper()
	h := &host{dev: dev}
	var err error
	if h.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if h.cq, err = dev.CreateCQ(4096); err != nil {
		t.Fatal(err)
	}
	if depth > 0 {
		if h.srq, err = verbs.CreateSRQ(h.pd, verbs.SRQAttr{MaxWR: depth, MaxSGE: 1}); err != nil {
			t.Fatal(err)
		}
		h.qp = h.srqQP(t)
	} else if h.qp, err = h.pd.CreateQP(verbs.QPInitAttr{SendCQ: h.cq, RecvCQ: h.cq, Cap: verbs.QPCap{
		MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 256}}); err != nil {
		t.Fatal(err)
	}
	if h.mem, err = verbs.Map(size, verbs.MapOptions{}); err != nil {
		t.Fatal(err)
	}
	h.mr, err = h.pd.RegMR(h.mem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *host) close(t testing.TB) {
	t.Helper()
	var errs []error
	if h.qp != nil { // nil: the test destroyed it
		errs = append(errs, h.qp.Destroy())
	}
	if h.srq != nil {
		errs = append(errs, h.srq.Destroy())
	}
	for _, err := range append(errs, h.mr.Dereg(), h.mem.Unmap(), h.cq.Destroy(), h.pd.Dealloc(), h.dev.Close()) {
		if err != nil {
			t.Error(err)
		}
	}
}

func (h *host) poll(t testing.TB) verbs.WorkCompletion {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := h.cq.Poll(h.wcs[:1])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return h.wcs[0]
		}
		time.Sleep(10 * time.Microsecond)
	}
	t.Fatal("no completion within 5s")
	return verbs.WorkCompletion{}
}

// connect joins a.qp and b.qp with cm.Connect over a loopback TCP connection.
func connect(t testing.TB, a, b *host) {
	t.Helper()
	connectVia(t, a, b, nil)
}

// connectVia is connect with b's stream passed through wrap (when not nil).
func connectVia(t testing.TB, a, b *host, wrap func(net.Conn) net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, accepted := dialQP(ctx, t, b.qp, wrap)
	if _, err := cm.Connect(ctx, c, a.qp, cm.DefaultParams()); err != nil {
		t.Fatal(err)
	}
	if !a.qp.(*QP).NeedsStream() {
		c.Close()
	}
	if err := accepted(); err != nil {
		t.Fatal(err)
	}
}

// dialQP listens on loopback and, on a goroutine, connects qp with cm.Connect over the
// connection it accepts (passed through wrap when not nil), closing that connection after
// if qp's wire is not its stream. It returns the dialing end, for the other side's
// handshake, and a func that waits for qp's side's result.
func dialQP(ctx context.Context, t testing.TB, qp verbs.QP, wrap func(net.Conn) net.Conn) (net.Conn, func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		ln.Close()
		if err == nil && wrap != nil {
			c = wrap(c)
		}
		if err == nil {
			_, err = cm.Connect(ctx, c, qp, cm.DefaultParams())
			if !qp.(*QP).NeedsStream() {
				c.Close()
			}
		}
		errc <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c, func() error { return <-errc }
}

func fabrics(t testing.TB) map[string]func(string) *Device {
	f := NewFabric()
	return map[string]func(string) *Device{
		"inproc": func(n string) *Device { d, _ := f.Open(n); return d },
		"tcp":    func(n string) *Device { d, _ := OpenTCP(n); return d },
	}
}

func TestSmokeSendReadInvalidate(t *testing.T) {
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			c, s := newHost(t, open("c"), 1<<20), newHost(t, open("s"), 1<<20)
			defer c.close(t)
			defer s.close(t)
			connect(t, c, s)

			// C exposes 4 KiB through a type-2 window and announces it in a SEND.
			mw, err := c.pd.AllocMW(verbs.MWType2)
			if err != nil {
				t.Fatal(err)
			}
			defer mw.Dealloc()
			payload := c.mr.Bytes()[8192 : 8192+4096]
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			rkey := verbs.IncRkey(mw.RKey())
			must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, 64)}}}))
			must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 2, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 64, 64)}}}))
			must(t, c.qp.PostRecv([]verbs.RecvWR{{WRID: 3, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 64)}}}))
			copy(c.mr.Bytes()[100:], "window!")
			must(t, c.qp.PostSend([]verbs.SendWR{
				{WRID: 10, Opcode: verbs.WRBindMW, Bind: verbs.MWBind{MW: mw, RKey: rkey, MR: c.mr, Addr: c.mr.Addr() + 8192, Length: 4096, Access: verbs.AccessRemoteRead}},
				{WRID: 11, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 100, 7)}},
			}))
			if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != 1 || wc.ByteLen != 7 || string(s.mr.Bytes()[:7]) != "window!" {
				t.Fatalf("server recv: %v %q", wc, s.mr.Bytes()[:7])
			}
			if wc := c.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != 11 {
				t.Fatalf("client send: %v", wc)
			}
			// S reads the window, then revokes it.
			must(t, s.qp.PostSend([]verbs.SendWR{
				{WRID: 20, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 65536, 4096)}, RemoteAddr: c.mr.Addr() + 8192, RKey: rkey},
			}))
			if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.ByteLen != 4096 || !bytes.Equal(s.mr.Bytes()[65536:65536+4096], payload) {
				t.Fatalf("read: %v", wc)
			}
			must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 21, Opcode: verbs.WRSendWithInv, Flags: verbs.SendSignaled, InvalidateRKey: rkey}}))
			if wc := c.poll(t); wc.Status != verbs.WCSuccess || wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != rkey {
				t.Fatalf("client recv with inv: %v", wc)
			}
			if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != 21 {
				t.Fatalf("send with inv: %v", wc)
			}
			// The old rkey no longer works.
			must(t, s.qp.PostSend([]verbs.SendWR{
				{WRID: 22, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 65536, 16)}, RemoteAddr: c.mr.Addr() + 8192, RKey: rkey},
			}))
			if wc := s.poll(t); wc.Status != verbs.WCRemAccessErr {
				t.Fatalf("read after invalidate: %v", wc)
			}
			if st := s.qp.State(); st != verbs.QPStateError {
				t.Fatalf("reader QP state %v", st)
			}
			if wc := s.poll(t); wc.Status != verbs.WCWRFlushErr || wc.WRID != 2 {
				t.Fatalf("flushed recv: %v", wc)
			}
			t.Logf("stats c=%+v s=%+v", c.dev.Stats(), s.dev.Stats())
		})
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
