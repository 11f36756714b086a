package shm

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
	"golang.org/x/sys/unix"
)

// readSetup is a registered source on qb's side and a registered destination on qa's.
type readSetup struct {
	src, dst       []byte
	srcMR, dstMR   verbs.MR
	srcMem, dstMem *verbs.Memory
}

func newReadSetup(t *testing.T, p *qpPair, n int, shared bool) *readSetup {
	t.Helper()
	r := &readSetup{}
	var err error
	if r.srcMem, err = verbs.Map(n, verbs.MapOptions{Shared: true}); err != nil {
		t.Fatal(err)
	}
	if r.dstMem, err = verbs.Map(n, verbs.MapOptions{Shared: shared}); err != nil {
		t.Fatal(err)
	}
	if r.srcMR, err = p.pds[1].RegMR(r.srcMem.Bytes(), verbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if r.dstMR, err = p.pds[0].RegMR(r.dstMem.Bytes(), verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, err := range []error{r.srcMR.Dereg(), r.dstMR.Dereg(), r.srcMem.Unmap(), r.dstMem.Unmap()} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	r.src, r.dst = r.srcMem.Bytes(), r.dstMem.Bytes()
	return r
}

// read posts one READ of all of r.src into r.dst on qa and waits for its completion.
func (r *readSetup) read(t *testing.T, p *qpPair, fill byte) {
	t.Helper()
	for i := range r.src {
		r.src[i] = fill + byte(i*7)
	}
	wr := verbs.SendWR{WRID: uint64(fill), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL:        []verbs.SGE{{Addr: r.dstMR.Addr(), Length: uint32(len(r.dst)), LKey: r.dstMR.LKey()}},
		RemoteAddr: r.srcMR.Addr(), RKey: r.srcMR.RKey()}
	if err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, p.cqs[0], len(r.dst))
	if !bytes.Equal(r.dst, r.src) {
		t.Fatal("READ's destination differs from its source")
	}
}

// TestPlacedRead: a READ into shared memory is placed (one copy, by the source's owner)
// once the peer has mapped the destination's mapping; the first READ into it, which
// announces it, READs into private memory and READs into shared memory of a side that
// keeps its memory private (Config.PrivateMemory: nothing is announced) go through the
// ring and read the same bytes, as do READs of a side whose peer runs as another user it
// admitted (PeerUIDs) unless it opted in (ShareWithOtherUsers).
func TestPlacedRead(t *testing.T) {
	self := uint32(os.Geteuid())
	for _, tc := range []struct {
		name      string
		mapShared bool // the destination is a shared mapping
		cfg       Config
		otherUID  bool // the requester's peer runs as another (allowed) user
		placed    bool
	}{
		{"shared destination", true, Config{}, false, true},
		{"private destination", false, Config{}, false, false},
		{"Config.PrivateMemory", true, Config{PrivateMemory: true}, false, false},
		{"peer of another user", true, Config{PeerUIDs: []uint32{self, self + 1}}, true, false},
		{"peer of another user, opted in", true, Config{PeerUIDs: []uint32{self, self + 1}, ShareWithOtherUsers: true}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			p := newQPPairWith(t, tc.cfg)
			if tc.otherUID {
				// A second user needs root and a test binary that user may run; the
				// credential the kernel reported is replaced here, and the decision
				// made from it as newConn makes it.
				p.a.remote.UID = self + 1
				p.a.shares = p.a.cfg.sharesWith(p.a.remote.UID, self)
			}
			r := newReadSetup(t, p, 1<<20, tc.mapShared)
			r.read(t, p, 1) // announces a shared destination
			waitMapped(t, p.a, tc.placed)
			before := p.devs[1].Stats()
			r.read(t, p, 2)
			r.read(t, p, 3)
			placed := p.devs[1].Stats().PlacedBytes - before.PlacedBytes
			want := uint64(0)
			if tc.placed {
				want = 2 << 20
			}
			if placed != want {
				t.Fatalf("responder placed %d bytes, want %d", placed, want)
			}
		})
	}
}

// waitMapped waits until c's peer has mapped every region c announced (none if !shared).
func waitMapped(t *testing.T, c *Conn, shared bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.shareMu.Lock()
		n, mapped := len(c.announced), 0
		for _, r := range c.announced {
			if r.mapped {
				mapped++
			}
		}
		c.shareMu.Unlock()
		if !shared && n == 0 || shared && n == 1 && mapped == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d regions announced, %d mapped, want %v", n, mapped, shared)
		}
	}
}

// TestPlacedReadOutOfRange: a placed READ or WRITE that names memory the peer did not
// share (a region never announced, a range past its region's end) is refused with
// ErrProtocol (the soft QP then takes the link down), and nothing is copied.
func TestPlacedReadOutOfRange(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{}, Config{})
	mem, err := verbs.Map(1<<16, verbs.MapOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Unmap()
	if _, ok := a.ShareLocal(mem.Bytes()); ok {
		t.Fatal("a mapping is placeable before the peer mapped it")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := a.ShareLocal(mem.Bytes()[100:200]); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the peer never mapped the announced region")
		}
	}
	src := make([]byte, 4096)
	if err := b.CopyToPeer(soft.Placement{Region: 0, Offset: 1<<16 - 4096}, src); err != nil {
		t.Fatalf("a copy to the region's last bytes: %v", err)
	}
	for _, dst := range []soft.Placement{
		{Region: 1, Offset: 0},
		{Region: 0, Offset: 1<<16 - 4095},
		{Region: 0, Offset: 1 << 63},
	} {
		if err := b.CopyToPeer(dst, src); !errors.Is(err, ErrProtocol) {
			t.Errorf("copy to %+v: %v, want ErrProtocol", dst, err)
		}
		if err := b.CopyFromPeer(src, dst); !errors.Is(err, ErrProtocol) {
			t.Errorf("copy from %+v: %v, want ErrProtocol", dst, err)
		}
	}
}

// TestPlacedWrite: a WRITE from shared memory that the peer has mapped is placed (the
// target pulls it: one copy, by the target's owner); one from private memory goes through
// the ring; both land the same bytes.
func TestPlacedWrite(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared bool
	}{{"shared source", true}, {"private source", false}} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			p := newQPPair(t)
			const n = 1 << 20
			srcMem, err := verbs.Map(n, verbs.MapOptions{Shared: tc.shared})
			if err != nil {
				t.Fatal(err)
			}
			dstMem, err := verbs.Map(n, verbs.MapOptions{Shared: true})
			if err != nil {
				t.Fatal(err)
			}
			srcMR, err := p.pds[0].RegMR(srcMem.Bytes(), 0)
			if err != nil {
				t.Fatal(err)
			}
			dstMR, err := p.pds[1].RegMR(dstMem.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				for _, err := range []error{srcMR.Dereg(), dstMR.Dereg(), srcMem.Unmap(), dstMem.Unmap()} {
					if err != nil {
						t.Error(err)
					}
				}
			})
			write := func(fill byte) {
				src := srcMem.Bytes()
				for i := range src {
					src[i] = fill + byte(i*5)
				}
				wr := verbs.SendWR{WRID: uint64(fill), Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
					SGL:        []verbs.SGE{{Addr: srcMR.Addr(), Length: n, LKey: srcMR.LKey()}},
					RemoteAddr: dstMR.Addr(), RKey: dstMR.RKey()}
				if err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
					t.Fatal(err)
				}
				waitWC(t, p.cqs[0], n)
				if !bytes.Equal(dstMem.Bytes(), src) {
					t.Fatal("WRITE's target differs from its source")
				}
			}
			write(1) // announces a shared source
			waitMapped(t, p.a, tc.shared)
			before := p.devs[1].Stats().PlacedBytes
			write(2)
			write(3)
			placed := p.devs[1].Stats().PlacedBytes - before
			want := uint64(0)
			if tc.shared {
				want = 2 * n
			}
			if placed != want {
				t.Fatalf("target placed %d bytes, want %d", placed, want)
			}
		})
	}
}

// waitWC waits for one successful completion on cq; a READ's must say n bytes.
func waitWC(t *testing.T, cq verbs.CQ, n int) verbs.WorkCompletion {
	t.Helper()
	wcs := make([]verbs.WorkCompletion, 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Microsecond) {
		got, err := cq.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		if got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion after 10 s")
		}
	}
	if wcs[0].Status != verbs.WCSuccess || wcs[0].Opcode == verbs.WCRDMARead && wcs[0].ByteLen != uint32(n) {
		t.Fatalf("completion %+v", wcs[0])
	}
	return wcs[0]
}

// sendSetup is a registered source of n bytes on qa's side and a registered destination of
// n bytes on qb's, both in shared memory.
type sendSetup struct {
	src, dst     []byte
	srcMR, dstMR verbs.MR
}

func newSendSetup(t *testing.T, p *qpPair, n int) *sendSetup {
	t.Helper()
	srcMem, err := verbs.Map(n, verbs.MapOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	dstMem, err := verbs.Map(n, verbs.MapOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	s := &sendSetup{src: srcMem.Bytes(), dst: dstMem.Bytes()}
	if s.srcMR, err = p.pds[0].RegMR(s.src, 0); err != nil {
		t.Fatal(err)
	}
	if s.dstMR, err = p.pds[1].RegMR(s.dst, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, err := range []error{s.srcMR.Dereg(), s.dstMR.Dereg(), srcMem.Unmap(), dstMem.Unmap()} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	return s
}

// sges splits the first n bytes of mr's memory into parts segments, the last taking the rest.
func sges(mr verbs.MR, n, parts int) []verbs.SGE {
	var l []verbs.SGE
	for i, off := 0, 0; i < parts; i++ {
		k := n / parts
		if i == parts-1 {
			k = n - off
		}
		l = append(l, verbs.SGE{Addr: mr.Addr() + uint64(off), Length: uint32(k), LKey: mr.LKey()})
		off += k
	}
	return l
}

// send posts a receive of s.dst in recvParts segments on qb and a SEND_WITH_IMM of n bytes
// of s.src gathered from sendParts on qa, and checks the receive's completion and bytes.
func (s *sendSetup) send(t *testing.T, p *qpPair, n, sendParts, recvParts int, fill byte) {
	t.Helper()
	for i := range s.src[:n] {
		s.src[i] = fill + byte(i*3)
	}
	clear(s.dst)
	if err := p.qb.PostRecv([]verbs.RecvWR{{WRID: uint64(fill), SGL: sges(s.dstMR, len(s.dst), recvParts)}}); err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{WRID: uint64(fill), Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled,
		SGL: sges(s.srcMR, n, sendParts), ImmData: uint32(fill)}
	if err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, p.cqs[1], n)
	if wc.Opcode != verbs.WCRecv || wc.ByteLen != uint32(n) || wc.Flags&verbs.WCWithImm == 0 || wc.ImmData != uint32(fill) {
		t.Fatalf("receive completion %+v, want RECV of %d bytes with immediate %d", wc, n, fill)
	}
	waitWC(t, p.cqs[0], 0)
	if !bytes.Equal(s.dst[:n], s.src[:n]) {
		t.Fatal("the received bytes differ from the sent ones")
	}
}

// TestPlacedSend: a SEND of soft.PlacedSendMin to soft.PlacedSendMax bytes, gathered from at
// most soft.MaxSendPlacements segments of shared memory the peer has mapped, is placed (the
// receiver copies it from the sender's memory into its receive: one copy), into a receive
// of one segment or several, and a larger one too once the QP's user says more are in
// flight (PlaceLargeSends); a smaller or larger SEND, and one gathered from more segments,
// go through the ring; all land the same bytes, with the immediate data.
func TestPlacedSend(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		n, sendParts, recvParts int
		large                   bool // PlaceLargeSends(true): more in flight
		placed                  bool
	}{
		{"4 KiB, one segment", 4 << 10, 1, 1, false, true},
		{"an envelope and a body, scattered into three", soft.PlacedSendMax, 2, 3, false, true},
		{"four segments", 16 << 10, soft.MaxSendPlacements, 1, false, true},
		{"five segments", 16 << 10, soft.MaxSendPlacements + 1, 1, false, false},
		{"below PlacedSendMin", soft.PlacedSendMin - 1, 1, 1, false, false},
		{"above PlacedSendMax", soft.PlacedSendMax + 1, 1, 1, false, false},
		{"above PlacedSendMax, more in flight", 64 << 10, 2, 1, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			p := newQPPairCap(t, Config{}, verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 8, MaxRecvSGE: 8})
			s := newSendSetup(t, p, 64<<10)
			s.send(t, p, soft.PlacedSendMin, 1, 1, 1) // announces the source's region
			waitMapped(t, p.a, true)
			p.qa.(*soft.QP).PlaceLargeSends(tc.large)
			before := p.devs[1].Stats().PlacedBytes
			s.send(t, p, tc.n, tc.sendParts, tc.recvParts, 2)
			s.send(t, p, tc.n, tc.sendParts, tc.recvParts, 3)
			placed := p.devs[1].Stats().PlacedBytes - before
			want := uint64(0)
			if tc.placed {
				want = 2 * uint64(tc.n)
			}
			if placed != want {
				t.Fatalf("the receiver placed %d bytes, want %d", placed, want)
			}
		})
	}
}

// TestPlacedSendOutOfRange: a placed SEND whose placement the receiver finds outside what
// its peer shared fails the receiver's QP as the peer breaking the protocol, its receive
// flushed and nothing copied; the sender's SEND never completes successfully.
func TestPlacedSendOutOfRange(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	var whole []byte // the receiver's mapping of the sender's region
	t.Cleanup(func() {
		// The connection's close could not unmap the shortened view below (unix.Munmap
		// takes a mapping only whole, as it was mapped): the mapping is this test's to
		// unmap, once the connection is closed.
		if whole != nil {
			if err := unix.Munmap(whole); err != nil {
				t.Errorf("unmapping the receiver's mapping of the region: %v", err)
			}
		}
	})
	p := newQPPair(t)
	s := newSendSetup(t, p, 64<<10)
	s.send(t, p, soft.PlacedSendMin, 1, 1, 1)
	waitMapped(t, p.a, true)
	// The receiver's view of the sender's region shrinks to 1 KiB: the sender's next
	// placement, of 4 KiB, now names memory it did not share.
	p.b.peerMu.Lock()
	whole = p.b.peerRegions[0].mem
	p.b.peerRegions[0].mem = whole[:1<<10]
	p.b.peerMu.Unlock()
	clear(s.dst)
	if err := p.qb.PostRecv([]verbs.RecvWR{{WRID: 9, SGL: sges(s.dstMR, len(s.dst), 1)}}); err != nil {
		t.Fatal(err)
	}
	wr := verbs.SendWR{WRID: 9, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: sges(s.srcMR, 4<<10, 1)}
	if err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, p.qb); !errors.Is(err, verbs.ErrPeerProtocol) {
		t.Fatalf("the receiver's fault: %v, want ErrPeerProtocol", err)
	}
	wcs := make([]verbs.WorkCompletion, 1)
	if n, _ := p.cqs[1].Poll(wcs); n != 1 || wcs[0].Status != verbs.WCWRFlushErr {
		t.Fatalf("the receive's completion: %d, %+v; want one, flushed", n, wcs[0])
	}
	if bytes.Count(s.dst, []byte{0}) != len(s.dst) {
		t.Fatal("a refused placed SEND wrote into the receive")
	}
}
