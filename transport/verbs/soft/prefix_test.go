package soft

import (
	"fmt"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestWrittenPrefix: a window counts the prefix of itself that the peer's RDMA WRITEs
// covered without a gap since its bind (verbs.WritePrefixer), on every fabric: a WRITE
// that starts inside the prefix extends it, one past it does not (nor does it count later),
// and a new bind starts again from zero.
func TestWrittenPrefix(t *testing.T) {
	const base, size = 8192, 4096
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			c, s := newHost(t, open("c"), 1<<20), newHost(t, open("s"), 1<<20)
			defer c.close(t)
			defer s.close(t)
			connect(t, c, s)
			mw, err := c.pd.AllocMW(verbs.MWType2)
			if err != nil {
				t.Fatal(err)
			}
			defer mw.Dealloc()
			wp, ok := mw.(verbs.WritePrefixer)
			if !ok {
				t.Fatal("the soft NIC's windows do not count what WRITEs covered")
			}
			rkey := mw.RKey()
			bind := func() {
				t.Helper()
				rkey = verbs.IncRkey(rkey)
				must(t, c.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRBindMW, Flags: verbs.SendSignaled,
					Bind: verbs.MWBind{MW: mw, RKey: rkey, MR: c.mr, Addr: c.mr.Addr() + base, Length: size, Access: verbs.AccessRemoteWrite}}}))
				if wc := c.poll(t); wc.Status != verbs.WCSuccess {
					t.Fatalf("bind: %v", wc)
				}
			}
			write := func(off, n int) {
				t.Helper()
				must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, n)}, RemoteAddr: c.mr.Addr() + base + uint64(off), RKey: rkey}}))
				if wc := s.poll(t); wc.Status != verbs.WCSuccess {
					t.Fatalf("WRITE [%d,+%d): %v", off, n, wc)
				}
			}
			bind()
			if p := wp.WrittenPrefix(); p != 0 {
				t.Fatalf("a window just bound: prefix %d, want 0", p)
			}
			for _, step := range []struct{ off, n, want int }{
				{0, 1000, 1000},
				{2000, 1000, 1000}, // past the prefix: a gap
				{500, 1500, 2000},  // from inside it: extends it, the write past the gap not counted
				{1000, 500, 2000},  // inside it
				{2000, size - 2000, size},
			} {
				t.Run(fmt.Sprintf("[%d,+%d)", step.off, step.n), func(t *testing.T) {
					write(step.off, step.n)
					if p := wp.WrittenPrefix(); p != uint64(step.want) {
						t.Fatalf("prefix %d, want %d", p, step.want)
					}
				})
			}
			must(t, c.qp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.WRLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: rkey}}))
			if wc := c.poll(t); wc.Status != verbs.WCSuccess {
				t.Fatalf("LOCAL_INV: %v", wc)
			}
			if p := wp.WrittenPrefix(); p != size {
				t.Fatalf("invalidated: prefix %d, want %d (it stays until the next bind)", p, size)
			}
			bind()
			if p := wp.WrittenPrefix(); p != 0 {
				t.Fatalf("bound again: prefix %d, want 0", p)
			}
		})
	}
}
