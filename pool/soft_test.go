package pool

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// softSide is one end of a connected soft QP pair, with a pool on its PD.
type softSide struct {
	dev  *soft.Device
	pd   verbs.PD
	cq   verbs.CQ
	qp   verbs.QP
	pool *Pool
	wcs  [1]verbs.WorkCompletion
}

func newSoftSide(t *testing.T, dev *soft.Device) *softSide {
	t.Helper()
	s := &softSide{dev: dev}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = dev.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{
		MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if s.pool, err = New(s.pd, Config{Classes: []int{256, 64 << 10}, SlabSize: 256 << 10}); err != nil {
		t.Fatal(err)
	}
	return s
}

// close releases everything in the order verbs requires, failing on leaks.
func (s *softSide) close(t *testing.T) {
	t.Helper()
	for _, err := range []error{s.qp.Destroy(), s.pool.Close(), s.cq.Destroy(), s.pd.Dealloc(), s.dev.Close()} {
		if err != nil {
			t.Error(err)
		}
	}
}

// poll waits for the next completion.
func (s *softSide) poll(t *testing.T) verbs.WorkCompletion {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := s.cq.Poll(s.wcs[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return s.wcs[0]
		}
		time.Sleep(20 * time.Microsecond)
	}
	t.Fatal("no completion within 5s")
	return verbs.WorkCompletion{}
}

func (s *softSide) expect(t *testing.T, wrid uint64, op verbs.WCOpcode) verbs.WorkCompletion {
	t.Helper()
	wc := s.poll(t)
	if wc.Status != verbs.WCSuccess || wc.WRID != wrid || wc.Opcode != op {
		t.Fatalf("completion %v, want wrid %d %v SUCCESS", wc, wrid, op)
	}
	return wc
}

// connectSoft joins two QPs with cm.Connect over a loopback TCP connection.
func connectSoft(t *testing.T, a, b verbs.QP) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = cm.Connect(ctx, c, b, cm.DefaultParams())
			if sq, ok := b.(verbs.StreamQP); !ok || !sq.NeedsStream() {
				c.Close()
			}
		}
		errc <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cm.Connect(ctx, c, a, cm.DefaultParams()); err != nil {
		t.Fatal(err)
	}
	if sq, ok := a.(verbs.StreamQP); !ok || !sq.NeedsStream() {
		c.Close()
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestSoftWindowRotation runs the large-response path of the design on the soft
// provider: the owner C exposes a pool buffer through the next window of its ring, S
// READs it through the window's rkey and revokes it, by SEND_WITH_INV or, as a lease
// reclaim, by C's LOCAL_INV; the allocator then hands the same window out again with the
// next rkey. Finally a READ with a revoked rkey must fail.
func TestSoftWindowRotation(t *testing.T) {
	fabric := soft.NewFabric()
	fabrics := []struct {
		name string
		open func(string) (*soft.Device, error)
	}{
		{"inproc", fabric.Open},
		{"tcp", soft.OpenTCP},
	}
	for _, f := range fabrics {
		t.Run(f.name, func(t *testing.T) {
			devC, err := f.open("c")
			if err != nil {
				t.Fatal(err)
			}
			devS, err := f.open("s")
			if err != nil {
				t.Fatal(err)
			}
			c, s := newSoftSide(t, devC), newSoftSide(t, devS)
			defer s.close(t)
			defer c.close(t)
			connectSoft(t, c.qp, s.qp)
			ws, err := NewWindows(c.pd, c.qp, 1) // one window: every round reuses it
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := ws.Close(); err != nil {
					t.Error(err)
				}
			}()
			ctx := context.Background()
			const size = 40000
			var lastRKey uint32
			for round := range 4 {
				// S posts a receive for the header; C, one for a SEND_WITH_INV.
				hdrBuf, _ := s.pool.Get(ctx, 16)
				must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 100, SGL: []verbs.SGE{hdrBuf.SGE()}}}))
				invBuf, _ := c.pool.Get(ctx, 0)
				must(t, c.qp.PostRecv([]verbs.RecvWR{{WRID: 200, SGL: []verbs.SGE{invBuf.SGE()}}}))

				// C: a response in a pool buffer, behind the next window.
				resp, err := c.pool.Get(ctx, size)
				if err != nil {
					t.Fatal(err)
				}
				for i := range resp.Bytes() {
					resp.Bytes()[i] = byte(i*31 + round)
				}
				w, err := ws.Next()
				if err != nil {
					t.Fatalf("round %d: Next: %v", round, err)
				}
				if round > 0 && w.RKey() != verbs.IncRkey(lastRKey) {
					t.Fatalf("round %d: rkey 0x%x, want IncRkey(0x%x)", round, w.RKey(), lastRKey)
				}
				lastRKey = w.RKey()
				bind, err := ws.BindBufWR(w, resp, verbs.AccessRemoteRead, 1)
				if err != nil {
					t.Fatal(err)
				}
				hdr, _ := c.pool.Get(ctx, 16)
				binary.LittleEndian.PutUint64(hdr.Bytes(), resp.Addr())
				binary.LittleEndian.PutUint32(hdr.Bytes()[8:], w.RKey())
				binary.LittleEndian.PutUint32(hdr.Bytes()[12:], uint32(resp.Len()))
				// The bind is unsignaled; the SEND after it on the same QP is ordered after it.
				must(t, c.qp.PostSend([]verbs.SendWR{bind,
					{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline, SGL: []verbs.SGE{hdr.SGE()}}}))
				c.expect(t, 2, verbs.WCSend)
				hdr.Release()

				// S: READ through the window into its own pool buffer.
				s.expect(t, 100, verbs.WCRecv)
				addr := binary.LittleEndian.Uint64(hdrBuf.Bytes())
				rkey := binary.LittleEndian.Uint32(hdrBuf.Bytes()[8:])
				n := int(binary.LittleEndian.Uint32(hdrBuf.Bytes()[12:]))
				hdrBuf.Release()
				dst, _ := s.pool.Get(ctx, n)
				must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 101, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{dst.SGE()}, RemoteAddr: addr, RKey: rkey}}))
				if wc := s.expect(t, 101, verbs.WCRDMARead); wc.ByteLen != size || !bytes.Equal(dst.Bytes(), resp.Bytes()) {
					t.Fatalf("round %d: READ %v: data differs", round, wc)
				}
				dst.Release()

				var got Binding
				if round%2 == 0 {
					// S revokes with SEND_WITH_INV; C sees WITH_INV on its receive.
					must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 102, Opcode: verbs.WRSendWithInv, Flags: verbs.SendSignaled, InvalidateRKey: rkey}}))
					s.expect(t, 102, verbs.WCSend)
					wc := c.expect(t, 200, verbs.WCRecv)
					if wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != rkey {
						t.Fatalf("round %d: receive %v, want WITH_INV 0x%x", round, wc, rkey)
					}
					if got, err = ws.Invalidated(wc.InvalidatedRKey); err != nil {
						t.Fatal(err)
					}
					invBuf.Release()
				} else {
					// S never releases: C reclaims after the lease with LOCAL_INV.
					exp := ws.Expired(time.Now().Add(time.Minute), time.Minute, nil)
					if len(exp) != 1 || exp[0] != w {
						t.Fatalf("round %d: Expired = %v", round, exp)
					}
					inv, err := ws.Reclaim(w, 3)
					if err != nil {
						t.Fatal(err)
					}
					must(t, c.qp.PostSend([]verbs.SendWR{inv}))
					c.expect(t, 3, verbs.WCLocalInv)
					if got, err = ws.Invalidated(inv.InvalidateRKey); err != nil {
						t.Fatal(err)
					}
					// Consume C's receive with an empty SEND, so the next round starts clean.
					must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 103, Opcode: verbs.WRSend, Flags: verbs.SendSignaled}}))
					s.expect(t, 103, verbs.WCSend)
					c.expect(t, 200, verbs.WCRecv)
					invBuf.Release()
				}
				if got.Buf != resp || got.RKey != rkey {
					t.Fatalf("round %d: binding %+v", round, got)
				}
				got.Buf.Release() // the window is revoked: the buffer may be reused
			}
			st := ws.Stats()
			if st.Binds != 4 || st.RemoteInvalidations != 2 || st.LocalInvalidations != 2 || st.Reclaims != 2 || st.Free != 1 {
				t.Errorf("window stats %+v", st)
			}

			// The last rkey is revoked: S's READ with it fails, as on hardware (and both
			// QPs go to error, which ends the test).
			dst, _ := s.pool.Get(ctx, 16)
			defer dst.Release()
			probe, _ := c.pool.Get(ctx, 16)
			defer probe.Release()
			must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 104, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{dst.SGE()}, RemoteAddr: probe.Addr(), RKey: lastRKey}}))
			if wc := s.poll(t); wc.Status != verbs.WCRemAccessErr {
				t.Fatalf("READ with a revoked rkey: %v, want REM_ACCESS_ERR", wc)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		var pe *verbs.PostError
		if errors.As(err, &pe) {
			t.Fatalf("post: %v (wr %d)", err, pe.Index)
		}
		t.Fatal(err)
	}
}
