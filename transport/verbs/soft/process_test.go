package soft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"hash/crc32"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
)

// The peer process is this test binary run again with these variables set: it connects to
// the parent over the TCP fabric and plays the side that owns memory (C in DESIGN.md).
const (
	envPeerAddr = "MWRPC_SOFT_PEER_ADDR"
	envPeerSize = "MWRPC_SOFT_PEER_SIZE"
)

// TestMain runs the peer role when the test binary is started as a peer.
func TestMain(m *testing.M) {
	if addr := os.Getenv(envPeerAddr); addr != "" {
		if err := runPeer(addr); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(leakcheck.Main(m))
}

// announcement is what the peer SENDs: where its window is.
func announcement(addr uint64, n uint32, rkey, sum uint32) []byte {
	b := binary.LittleEndian.AppendUint64(nil, addr)
	b = binary.LittleEndian.AppendUint32(b, n)
	b = binary.LittleEndian.AppendUint32(b, rkey)
	return binary.LittleEndian.AppendUint32(b, sum)
}

// runPeer exposes size bytes through a type-2 window, announces it, and waits until the
// parent revokes the window with SEND_WITH_INV.
func runPeer(addr string) error {
	var size int
	if _, err := fmt.Sscan(os.Getenv(envPeerSize), &size); err != nil {
		return fmt.Errorf("bad %s: %w", envPeerSize, err)
	}
	dev, _ := OpenTCP("peer")
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	cq, err := dev.CreateCQ(64)
	if err != nil {
		return err
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	if err != nil {
		return err
	}
	mem, err := verbs.Map(size+4096, verbs.MapOptions{})
	if err != nil {
		return err
	}
	mr, err := pd.RegMR(mem.Bytes(), verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		return err
	}
	mw, err := pd.AllocMW(verbs.MWType2)
	if err != nil {
		return err
	}
	data := mr.Bytes()[4096 : 4096+size]
	for i := range data {
		data[i] = byte(i*31 + i>>8)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cm.Connect(ctx, conn, qp, cm.DefaultParams()); err != nil {
		return err
	}
	rkey := verbs.IncRkey(mw.RKey())
	copy(mr.Bytes(), announcement(mr.Addr()+4096, uint32(size), rkey, crc32.ChecksumIEEE(data)))
	if err := qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(mr, 1024, 64)}}}); err != nil {
		return err
	}
	err = qp.PostSend([]verbs.SendWR{
		{Opcode: verbs.WRBindMW, Bind: verbs.MWBind{MW: mw, RKey: rkey, MR: mr, Addr: mr.Addr() + 4096, Length: uint64(size), Access: verbs.AccessRemoteRead}},
		{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(mr, 0, 20)}},
	})
	if err != nil {
		return err
	}
	wcs := make([]verbs.WorkCompletion, 4)
	for got := 0; got < 2; {
		n, err := cq.Poll(wcs)
		if err != nil {
			return err
		}
		for _, wc := range wcs[:n] {
			got++
			switch {
			case wc.Status != verbs.WCSuccess:
				return fmt.Errorf("completion %v", wc)
			case wc.WRID == 1 && (wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != rkey):
				return fmt.Errorf("receive %v: want WITH_INV of 0x%x", wc, rkey)
			}
		}
		time.Sleep(20 * time.Microsecond)
	}
	fmt.Println("peer: window revoked by SEND_WITH_INV")
	// A clean exit: destroying the QP sends what it owes the parent (its delayed ACK).
	return errors.Join(qp.Destroy(), mw.Dealloc(), mr.Dereg(), mem.Unmap(), cq.Destroy(), pd.Dealloc(), dev.Close())
}

// startPeer runs the peer process and accepts its connection.
func startPeer(t *testing.T, size int) (*exec.Cmd, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envPeerAddr+"="+ln.Addr().String(), fmt.Sprintf("%s=%d", envPeerSize, size))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("peer process did not connect: %v", err)
	}
	return cmd, conn
}

// readAnnouncement connects s to the peer and returns its window.
func readAnnouncement(t *testing.T, s *host, conn net.Conn) (addr uint64, n uint32, rkey, sum uint32) {
	t.Helper()
	// Post the receive before connecting (in INIT), so the announcement never meets RNR.
	must(t, s.qp.Modify(verbs.QPAttr{State: verbs.QPStateInit, Access: cm.DefaultParams().Access}))
	must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, 64)}}}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cm.Connect(ctx, conn, s.qp, cm.DefaultParams()); err != nil {
		t.Fatal(err)
	}
	if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.ByteLen != 20 {
		t.Fatalf("announcement: %v", wc)
	}
	b := s.mr.Bytes()
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:]), binary.LittleEndian.Uint32(b[16:])
}

func TestTwoProcessesSendReadInvalidate(t *testing.T) {
	const size = 1 << 20
	cmd, conn := startPeer(t, size)
	dev, _ := OpenTCP("parent")
	s := newHost(t, dev, 2*size)
	defer s.close(t)
	addr, n, rkey, sum := readAnnouncement(t, s, conn)
	must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEFor(s.mr, size, int(n))}, RemoteAddr: addr, RKey: rkey}}))
	wc := s.poll(t)
	if wc.Status != verbs.WCSuccess || wc.ByteLen != size {
		t.Fatalf("READ from the peer process: %v", wc)
	}
	if got := crc32.ChecksumIEEE(s.mr.Bytes()[size : 2*size]); got != sum {
		t.Fatalf("READ data checksum 0x%x, peer announced 0x%x", got, sum)
	}
	must(t, s.qp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.WRSendWithInv, Flags: verbs.SendSignaled, InvalidateRKey: rkey}}))
	if wc := s.poll(t); wc.Status != verbs.WCSuccess || wc.WRID != 3 {
		t.Fatalf("SEND_WITH_INV: %v", wc)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("peer process: %v", err)
	}
	// The 20-byte announcement came with its frame's header and was copied out of the
	// reader's buffer (a small frame, wire.go); the 1 MiB READ went straight into memory.
	if st := dev.Stats(); st.SocketRxBytes != size || st.CopyBytes != 20 {
		t.Fatalf("copies: %+v: want the READ placed from the socket with no staging copy, and only the 20-byte announcement copied", st)
	}
}

// TestPeerKilledMidTransfer kills the peer process while READs of its 64 MiB window are in
// flight: every outstanding work request must complete with an error status, promptly.
func TestPeerKilledMidTransfer(t *testing.T) {
	const size = 64 << 20
	cmd, conn := startPeer(t, size)
	dev, _ := OpenTCP("parent")
	s := newHost(t, dev, size)
	defer s.close(t)
	addr, n, rkey, _ := readAnnouncement(t, s, conn)
	const reads = 8
	must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: 100, SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, 64)}}}))
	wrs := make([]verbs.SendWR, reads)
	for i := range wrs {
		wrs[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, int(n))}, RemoteAddr: addr, RKey: rkey}
	}
	must(t, s.qp.PostSend(wrs))
	// Kill once the first READ's data is streaming.
	for deadline := time.Now().Add(10 * time.Second); dev.Stats().SocketRxBytes < 1<<20; {
		if time.Now().After(deadline) {
			t.Fatal("no READ data arrived")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var ok, retry, flushed int
	for i := 0; i < reads+1; i++ {
		wc := s.poll(t)
		switch wc.Status {
		case verbs.WCSuccess:
			ok++
		case verbs.WCRetryExcErr:
			retry++
		case verbs.WCWRFlushErr:
			flushed++
		default:
			t.Errorf("unexpected %v", wc)
		}
	}
	t.Logf("after the kill: %d READs done, %d RETRY_EXC_ERR, %d flushed (incl. the receive)", ok, retry, flushed)
	if retry != 1 || ok+retry+flushed != reads+1 || ok == reads {
		t.Fatalf("want exactly one RETRY_EXC_ERR for the READ in flight and the rest flushed; got ok=%d retry=%d flushed=%d", ok, retry, flushed)
	}
	if st := s.qp.State(); st != verbs.QPStateError {
		t.Fatalf("QP state %v after the peer died, want ERR", st)
	}
}
