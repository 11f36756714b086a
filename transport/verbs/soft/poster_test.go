package soft

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestPosterWritesFrame: on a plain TCP stream the goroutine that posts a SEND of up to
// tryTxMax bytes (a 64 KiB eager message and its envelope) writes it itself, with no
// wake-up of the NIC engine (Stats.EngineWakes), and its peer receives it intact; a larger
// frame is still the engine's (so a poster's PostSend never writes a megabyte).
func TestPosterWritesFrame(t *testing.T) {
	if !directWrites {
		t.Skip("posters on this OS leave every frame over 16 KiB to the engine (directWrites is false)")
	}
	c, s := bigPair(t)
	send := func(n int, fill byte) {
		t.Helper()
		src := c.mr.Bytes()[:n]
		for i := range src {
			src[i] = fill + byte(i)
		}
		must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, n)}}}))
		must(t, c.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, n)}}}))
		if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.ByteLen != uint32(n) || !bytes.Equal(s.mr.Bytes()[:n], src) {
			t.Fatalf("%d B: receive %v, payload intact %v", n, wc, bytes.Equal(s.mr.Bytes()[:n], src))
		}
		if wc := c.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != 2 {
			t.Fatalf("%d B: send %v", n, wc)
		}
	}
	for i := range 20 {
		send(64<<10, byte(i))
	}
	if w := c.dev.Stats().EngineWakes; w != 0 {
		t.Errorf("20 SENDs of 64 KiB woke the sender's NIC engine %d times, want 0 (the poster writes them)", w)
	}
	send(big, 7)
	if w := c.dev.Stats().EngineWakes; w == 0 {
		t.Error("a 1 MiB SEND did not go through the NIC engine")
	}
}

// TestSendNow: a large frame written by a poster (tcpLink.sendNow) to a socket that is
// full never waits; what the socket did not take is copied out of the registered memory
// (which its owner may reuse at once) and written first by the next send or flush. Every
// frame arrives once, intact, in order, and a frame so sent costs no allocation.
func TestSendNow(t *testing.T) {
	if !directWrites {
		t.Skip("posters on this OS leave every frame over 16 KiB to the engine (directWrites is false)")
	}
	tc, peer := tcpPair(t)
	_ = tc.(*net.TCPConn).SetWriteBuffer(64 << 10)
	_ = peer.(*net.TCPConn).SetReadBuffer(64 << 10)
	raw, err := tc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	l := &tcpLink{q: bareQP(), conn: tc, raw: raw, direct: true}
	sent := make([]testFrame, 0, 1024)
	mem := make([]byte, tryTxMax)
	frame := func(n int) testFrame {
		return testFrame{header{op: opSend, psn: uint32(len(sent)), len: uint32(n)}, bytes.Repeat([]byte{byte(len(sent))}, n)}
	}
	sendFrame := func(f testFrame) {
		t.Helper()
		n := len(f.payload)
		sent = append(sent, f)
		copy(mem, f.payload)
		start := time.Now()
		if err := l.send(&f.h, [][]byte{mem[:n]}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("send waited %v", d)
		}
		clear(mem) // the poster's memory is reused at once: what was left must be a copy
	}
	sendOne := func(n int) { sendFrame(frame(n)) }
	f := frame(batchFrameMax + 1)
	if allocs := testing.AllocsPerRun(4, func() { sendFrame(f) }); allocs != 0 {
		t.Errorf("%.1f allocations per large frame sent now", allocs)
	}
	if l.out != nil {
		t.Fatalf("five frames of %d B to an empty socket left %d B", batchFrameMax+1, len(l.out))
	}
	drain(t, peer, sent)
	sent = sent[:0]
	for i := 0; i < 1000 && l.out == nil; i++ {
		sendOne(tryTxMax - i)
	}
	if l.out == nil {
		t.Fatal("the socket never filled")
	}
	l.direct = false // the engine: it writes out first, waiting for the socket
	last := testFrame{header{op: opSend, psn: uint32(len(sent)), len: 1}, []byte{1}}
	sent = append(sent, last)
	sendLast(t, l, peer, sent, last)
}

// sendLast sends the frame last on l as the engine does (send, then flush: what a full
// socket left, out, goes first) while the peer reads; the peer must get every frame of
// sent, which ends with last, intact and in order.
func sendLast(t *testing.T, l *tcpLink, peer io.Reader, sent []testFrame, last testFrame) {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- readAll(peer, sent) }()
	if err := l.send(&last.h, [][]byte{last.payload}); err != nil {
		t.Fatal(err)
	}
	if err := l.flush(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	tc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { peer.Close() })
	return tc, peer
}

func drain(t *testing.T, r io.Reader, want []testFrame) {
	t.Helper()
	if err := readAll(r, want); err != nil {
		t.Fatal(err)
	}
}

// readAll reads want's frames from r and reports the first that is not as sent.
func readAll(r io.Reader, want []testFrame) error {
	fr := frameReader{r: r}
	for i, w := range want {
		var h header
		small, err := fr.next(&h)
		if err == nil && small == nil {
			small = make([]byte, h.len)
			_, err = io.ReadFull(&fr, small)
		}
		if err != nil || h != w.h || !bytes.Equal(small, w.payload) {
			return fmt.Errorf("frame %d: %v, header %+v, want %+v", i, err, h, w.h)
		}
	}
	return nil
}

// TestWriteCarriesAnnouncement: the SENDs posted right behind a large RDMA WRITE (the
// message that announces a 1 MiB payload written into the peer's window) leave in the
// WRITE's writev, not in a write of their own: one write per WRITE and its announcement
// (Stats.Writes, the sender's side), whether the announcement is one small frame, a medium
// one (padded) or several (a BATCH), and whether the engine writes them (PostSend) or the
// poster does (PostSendWait, with no wake-up of the engine). The peer gets the payload and
// then the announcements, intact and in order, and the WRITE's memory is released (Dereg
// at close does not wait).
func TestWriteCarriesAnnouncement(t *testing.T) {
	c, s := bigPair(t)
	posts := []struct {
		name string
		post func([]verbs.SendWR) error
	}{{"PostSend", c.qp.PostSend}, {"PostSendWait", c.qp.(*QP).PostSendWait}}
	for _, p := range posts {
		for _, tc := range []struct {
			name  string
			sends []int // the announcements' lengths
		}{
			{"one small SEND", []int{68}},
			{"a medium SEND", []int{4 << 10}},
			{"three SENDs", []int{68, 200, 1 << 10}},
		} {
			t.Run(p.name+"/"+tc.name, func(t *testing.T) {
				const calls = 10
				before := c.dev.Stats()
				for i := range calls {
					writeAndAnnounce(t, c, s, p.post, big, tc.sends, byte(i))
				}
				after := c.dev.Stats()
				if w := after.Writes - before.Writes; w != calls {
					t.Errorf("%d WRITEs of 1 MiB, each with its announcements %v: %d writes, want %d (the announcements go in the WRITE's writev)", calls, tc.sends, w, calls)
				}
				if p.name != "PostSend" {
					if w := after.EngineWakes - before.EngineWakes; w != 0 {
						t.Errorf("%d WRITEs of 1 MiB posted with PostSendWait woke the engine %d times, want 0 (the poster writes them)", calls, w)
					}
					if w := after.WaitedPosts - before.WaitedPosts; w < calls {
						t.Errorf("%d WRITEs posted with PostSendWait: %d rounds written by their posters, want at least %d", calls, w, calls)
					}
				}
			})
		}
	}
}

// writeAndAnnounce posts, in one PostSend, a WRITE of n bytes from c's memory into s's and
// SENDs of the given lengths behind it; it checks that s receives each SEND, in order, with
// the WRITE's bytes already in place.
func writeAndAnnounce(t *testing.T, c, s *host, post func([]verbs.SendWR) error, n int, sends []int, fill byte) {
	t.Helper()
	src := c.mr.Bytes()[:n]
	for i := range src {
		src[i] = fill + byte(i)
	}
	wrs := []verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMAWrite, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, n)},
		RemoteAddr: s.mr.Addr(), RKey: s.mr.RKey()}}
	off := n // each SEND's payload behind the WRITE's, in both memories
	for i, m := range sends {
		b := c.mr.Bytes()[off : off+m]
		for j := range b {
			b[j] = byte(i) + fill + byte(j>>3)
		}
		must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(10 + i), SGL: []verbs.SGE{verbs.SGEFor(s.mr, off, m)}}}))
		wrs = append(wrs, verbs.SendWR{WRID: uint64(10 + i), Opcode: verbs.WRSend, SGL: []verbs.SGE{verbs.SGEFor(c.mr, off, m)}})
		off += m
	}
	wrs[len(wrs)-1].Flags = verbs.SendSignaled
	must(t, post(wrs))
	for i := range sends {
		wc := s.poll(t)
		if wc.Status != verbs.WCSuccess || wc.WRID != uint64(10+i) || wc.ByteLen != uint32(sends[i]) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
		if i == 0 && !bytes.Equal(s.mr.Bytes()[:n], src) {
			t.Fatal("the first announcement arrived before the WRITE's payload was in place")
		}
	}
	if !bytes.Equal(s.mr.Bytes()[n:off], c.mr.Bytes()[n:off]) {
		t.Fatal("the announcements' payloads differ")
	}
	if wc := c.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != uint64(10+len(sends)-1) {
		t.Fatalf("send completion %+v", wc)
	}
}

// TestKeepOrder: a large frame the engine keeps (tcpLink.keep) leaves after what was
// gathered before it and before what is sent after it, whether the frames behind it are
// written by a flush, by a larger frame that follows, or because pend filled up; the link
// keeps no reference to the frame's memory once it is written.
func TestKeepOrder(t *testing.T) {
	tc, peer := tcpPair(t)
	l := &tcpLink{q: bareQP(), conn: tc}
	var sent []testFrame
	frame := func(n int) testFrame {
		return testFrame{header{op: opSend, psn: uint32(len(sent)), len: uint32(n)}, bytes.Repeat([]byte{byte(len(sent) + 1)}, n)}
	}
	small := func(n int) {
		t.Helper()
		f := frame(n)
		sent = append(sent, f)
		if err := l.send(&f.h, [][]byte{f.payload}); err != nil {
			t.Fatal(err)
		}
	}
	large := func(n int) {
		t.Helper()
		f := frame(n)
		sent = append(sent, f)
		mem := bytes.Clone(f.payload) // the frame's own memory until written, as a WRITE's
		if !l.keepable(&f.h) {
			t.Fatalf("a %d B frame on a TCP stream is not keepable", n)
		}
		if err := l.keep(&f.h, [][]byte{mem[:n/2], mem[n/2 : n]}, nil); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan error, 1)
	small(10)
	large(2 * tryTxMax)
	small(68)
	small(batchFrameMax) // a medium one: with the small one before it, a BATCH
	if err := l.flush(); err != nil {
		t.Fatal(err)
	}
	large(tryTxMax)
	small(batchFrameMax) // alone: padded
	if err := l.flush(); err != nil {
		t.Fatal(err)
	}
	large(batchFrameMax + 1)
	for l.kept { // until pend fills up and is written, with the kept frame before it
		small(batchFrameMax)
	}
	large(batchFrameMax + 1) // the frames gathered since go before it
	small(1)
	large(tryTxMax) // the kept frame and the one behind it go before this one
	if err := l.flush(); err != nil {
		t.Fatal(err)
	}
	for i, b := range l.vec[:cap(l.vec)] {
		if b != nil {
			t.Fatalf("the link still references %d B (segment %d) after the flush", len(b), i)
		}
	}
	go func() { got <- readAll(peer, sent) }()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestDestroyWhileWriterWaits: a poster blocked in PostSendWait writing to a peer that
// stopped reading does not hold up Destroy, which ends the write with a deadline before it
// waits for the transmit lock (shutdownLocked); the poster then returns. Destroy used to
// take the lock first, and waited for as long as the peer did not read.
func TestDestroyWhileWriterWaits(t *testing.T) {
	const flood = 32 << 20 // more than loopback's socket buffers hold
	c, s := newHost(t, mustOpen(t), flood), newHost(t, mustOpen(t), flood)
	defer c.close(t)
	defer s.close(t)
	sc := &stallConn{stalled: make(chan struct{}), release: make(chan struct{})}
	connectVia(t, c, s, func(conn net.Conn) net.Conn { sc.Conn = conn; return sc })
	released := false
	release := func() {
		if !released {
			released = true
			close(sc.release)
		}
	}
	defer release()
	sc.arm()
	q := c.qp.(*QP)
	posted := make(chan error, 1)
	go func() {
		posted <- q.PostSendWait([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, flood)}, RemoteAddr: s.mr.Addr(), RKey: s.mr.RKey()}})
	}()
	select {
	case <-sc.stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's reader never stopped")
	}
	// The poster holds the transmit lock, blocked on the full socket.
	for deadline := time.Now().Add(5 * time.Second); q.txMu.TryLock(); {
		q.txMu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the poster never took the transmit lock")
		}
		time.Sleep(time.Millisecond)
	}
	destroyWhileBlocked(t, c, release, posted, "PostSendWait")
}

// destroyWhileBlocked destroys c's QP while a poster (who) is blocked writing to a peer
// that stopped reading, and fails unless Destroy returns within 5 s and the poster then
// returns nil (posted; its completion is flushed). release lets the peer read again, so that
// a failing test ends.
func destroyWhileBlocked(t *testing.T, c *host, release func(), posted <-chan error, who string) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	destroyed := make(chan error, 1)
	go func() { destroyed <- c.qp.Destroy() }()
	select {
	case err := <-destroyed:
		must(t, err)
	case <-time.After(5 * time.Second):
		release() // let the write finish, so that the test ends
		<-destroyed
		c.qp = nil
		t.Fatalf("Destroy waited for %s blocked on a peer that stopped reading", who)
	}
	c.qp = nil
	select {
	case err := <-posted:
		must(t, err)
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return after Destroy", who)
	}
}

// TestWaitWhileReaderReaps: while a stream reader of the device runs a completion handler,
// PostSendWait, for a goroutine that is certainly no reader, still writes a 1 MiB WRITE
// itself, where PostSend leaves it to the engine.
func TestWaitWhileReaderReaps(t *testing.T) {
	c, s := bigPair(t)
	q := c.qp.(*QP)
	for _, tc := range []struct {
		name  string
		post  func([]verbs.SendWR) error
		wakes bool // the engine writes the WRITE
	}{{"PostSend", q.PostSend, true}, {"PostSendWait", q.PostSendWait, false}} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.dev.Stats()
			c.dev.readersReaping.Add(1) // as cq.endDefer counts a reader running a handler
			writeAndAnnounce(t, c, s, tc.post, big, []int{68}, 9)
			c.dev.readersReaping.Add(-1)
			after := c.dev.Stats()
			wakes, waited := after.EngineWakes-before.EngineWakes, after.WaitedPosts-before.WaitedPosts
			if tc.wakes && (wakes == 0 || waited != 0) {
				t.Errorf("with a reader reaping: %d engine wake-ups, %d rounds written by the poster; want the engine to write it", wakes, waited)
			}
			if !tc.wakes && (wakes != 0 || waited == 0) {
				t.Errorf("with a reader reaping: %d engine wake-ups, %d rounds written by the poster; want the poster to write it", wakes, waited)
			}
		})
	}
}

// big is the size of the frames the poster tests post (an RDMA WRITE of a large message).
const big = 1 << 20

// bigPair returns two connected hosts with room for two big buffers each, closed at the
// test's cleanup.
func bigPair(t *testing.T) (c, s *host) {
	t.Helper()
	c, s = newHost(t, mustOpen(t), 2*big), newHost(t, mustOpen(t), 2*big)
	t.Cleanup(func() { c.close(t) })
	t.Cleanup(func() { s.close(t) })
	connect(t, c, s)
	return c, s
}

// gatherConn is a stream that writes a frame's pieces as one (BuffersWriter,
// TryBuffersWriter), as the shm fabric's does: it records the bytes each call was given;
// a TryWriteBuffers takes at most tryTake bytes (0: all).
type gatherConn struct {
	net.Conn
	writes, tries []int
	tryTake       int
}

func (g *gatherConn) WriteBuffers(v *net.Buffers) (int64, error) {
	g.writes = append(g.writes, buffersLen(*v))
	return v.WriteTo(g.Conn)
}

func (g *gatherConn) TryWriteBuffers(v *net.Buffers) (int64, error) {
	n := buffersLen(*v)
	g.tries = append(g.tries, n)
	if g.tryTake > 0 {
		n = min(n, g.tryTake)
	}
	b := make([]byte, 0, n)
	for len(b) < n {
		k := min(n-len(b), len((*v)[0]))
		b = append(b, (*v)[0][:k]...)
		if (*v)[0] = (*v)[0][k:]; len((*v)[0]) == 0 {
			*v = (*v)[1:]
		}
	}
	k, err := g.Conn.Write(b)
	return int64(k), err
}

func buffersLen(v net.Buffers) int {
	n := 0
	for _, b := range v {
		n += len(b)
	}
	return n
}

// TestMediumFrameWhole: on a stream that writes buffers as one, a medium frame (4 KiB)
// leaves in one call with its header and padding, from the poster's memory (nothing copied
// into pend); a stream reader's (trying) leaves from pend in one call, not sealed into
// stage first, and what the stream did not take is copied to out, which the engine writes
// first. The peer gets every frame intact and in order.
func TestMediumFrameWhole(t *testing.T) {
	tc, peer := tcpPair(t)
	g := &gatherConn{Conn: tc}
	q := bareQP()
	l := &tcpLink{q: q, conn: g, bw: g, tbw: g, direct: true}
	mem := make([]byte, 4<<10)
	frames := frameRun(len(mem), 3)
	send := func(f testFrame) {
		t.Helper()
		copy(mem, f.payload)
		if err := l.send(&f.h, [][]byte{mem}); err != nil {
			t.Fatal(err)
		}
		clear(mem) // reused at once: a frame left behind must be a copy
	}
	whole := headerLen + smallMax + len(mem)
	got := make(chan error, 1)
	go func() { got <- readAll(peer, frames) }()

	send(frames[0])
	if len(g.writes) != 1 || g.writes[0] != whole || l.pendN != 0 || q.st.copied.Load() != 0 {
		t.Fatalf("a poster's medium frame: writes %v, %d frames in pend, %d B copied; want one write of %d B, nothing copied", g.writes, l.pendN, q.st.copied.Load(), whole)
	}

	l.direct, l.trying = false, true // a stream reader transmits
	send(frames[1])
	if done, err := l.tryFlush(); !done || err != nil || len(g.tries) != 1 || g.tries[0] != whole || len(l.stage) != 0 {
		t.Fatalf("a reader's medium frame: done %v, %v, tries %v, %d B staged; want one try of %d B", done, err, g.tries, len(l.stage), whole)
	}

	g.tryTake = 1000 // the stream takes part of it
	send(frames[2])
	if done, err := l.tryFlush(); done || err != nil || len(l.out) != whole-1000 {
		t.Fatalf("a medium frame the stream took 1000 B of: done %v, %v, out %d B; want %d B left", done, err, len(l.out), whole-1000)
	}
	l.trying = false
	if err := l.flush(); err != nil { // the engine: out first
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// frameRun returns count SEND frames of n payload bytes, psn 0 up, each payload filled
// with its psn plus one.
func frameRun(n, count int) []testFrame {
	var fs []testFrame
	for i := range count {
		fs = append(fs, testFrame{header{op: opSend, psn: uint32(i), len: uint32(n)}, bytes.Repeat([]byte{byte(i + 1)}, n)})
	}
	return fs
}
