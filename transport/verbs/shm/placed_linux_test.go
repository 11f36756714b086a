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
			checkFDs(t)
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
	checkFDs(t)
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
			checkFDs(t)
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
