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
	const big = 1 << 20
	c, s := newHost(t, mustOpen(t), 2*big), newHost(t, mustOpen(t), 2*big)
	defer c.close(t)
	defer s.close(t)
	connect(t, c, s)
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
	got := make(chan error, 1)
	go func(want []testFrame) { got <- readAll(peer, want) }(sent)
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
