package shm

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// ringSeals are the seals a ring's memfd must carry: its size can no longer change (so a
// peer cannot truncate it under a mapping and make the other side fault on a missing
// page), and no seal can be added or removed.
const ringSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// newRingFile creates the ring this side receives on: a memfd of the ring's size, mapped,
// its header written, then sealed. It returns the file descriptor (to pass to the peer,
// then close) and the mapping (this side's until Close).
func newRingFile(size int) (int, []byte, error) {
	fd, err := unix.MemfdCreate("mwrpc-shm-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	n := ringFileSize(size)
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("shm: size the ring's memfd to %d bytes: %w", n, err)
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("shm: map the ring's memfd (%d bytes): %w", n, err)
	}
	initRing(mem, size)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, ringSeals); err != nil {
		_ = unix.Munmap(mem)
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("shm: seal the ring's memfd: %w", err)
	}
	return fd, mem, nil
}

// mapPeerRing maps the ring the peer created for this side to write into, once the file
// is what the hello said: a memfd sealed against resizing, of exactly the ring's size,
// with a valid header. fd stays the caller's.
func mapPeerRing(fd, size int) ([]byte, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("peer's ring is not a memfd (F_GET_SEALS: %v): %w", err, ErrProtocol)
	}
	if seals&ringSeals != ringSeals {
		return nil, fmt.Errorf("peer's ring memfd has seals 0x%x, want at least 0x%x (it could be resized under the mapping): %w", seals, ringSeals, ErrProtocol)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: fstat the peer's ring: %w", err)
	}
	if st.Size != int64(ringFileSize(size)) {
		return nil, fmt.Errorf("peer's ring file is %d bytes, its hello says %d: %w", st.Size, ringFileSize(size), ErrProtocol)
	}
	mem, err := unix.Mmap(fd, 0, ringFileSize(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: map the peer's ring (%d bytes): %w", ringFileSize(size), err)
	}
	if err := checkRingHeader(mem, size); err != nil {
		_ = unix.Munmap(mem)
		return nil, fmt.Errorf("peer's ring: %w", err)
	}
	return mem, nil
}

// bell is a doorbell this side sleeps on: an eventfd in the Go netpoller, so that a
// sleeping reader holds no OS thread and its deadlines are the file's.
//
// Its counter is never read. The netpoller watches the descriptor edge-triggered, and an
// eventfd reports a new edge on every write whatever its count, so a sleeper only has to
// be told that a write came after it started waiting: wait re-checks its condition after
// the poller forgets older edges, and sleeps only when that check fails. Reading the
// counter would cost two more system calls per sleep (the read that finds it empty before
// parking, the one that empties it after). The count cannot overflow in practice (one
// per doorbell, up to 2^64-2); the peer, which holds the descriptor, could fill it, and
// wake empties it before ringing this side's own doorbell.
type bell struct {
	f  *os.File
	rc syscall.RawConn // f's, to wait for an edge without reading
	fd int             // f's descriptor, to pass to the peer and to ring ourselves (valid until f.Close)
}

func newBell(name string) (*bell, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("shm: eventfd: %w", err)
	}
	// A non-blocking descriptor: os.NewFile puts it in the netpoller.
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("shm: eventfd: %w", err)
	}
	return &bell{f: f, rc: rc, fd: fd}, nil
}

// wait returns once check reports true, calling it first and then after each ring of the
// bell, or with the error of the file's read deadline or its closing. check publishes that
// its caller sleeps (its waiter flag) before it looks (flagThenCheck), so a peer that makes
// it true after a look also rings. (Each call follows the poller's reset of the
// descriptor's readiness: a ring before it is forgotten, and need not be remembered.)
func (b *bell) wait(check func(uintptr) bool) error {
	return b.rc.Read(check)
}

// wake rings this side's own doorbell, so that its sleeper sees why (Close, the socket's
// end). The peer holds the descriptor too and may have filled its counter, after which a
// write fails (EAGAIN) and makes no edge: then the counter is emptied and rung again.
// Either that write or one of the peer's after the emptying makes an edge, and the sleeper
// checks the state its waker set before ringing.
func (b *bell) wake() {
	if _, err := unix.Write(b.fd, one[:]); err != unix.EAGAIN {
		return
	}
	var v [8]byte
	_, _ = unix.Read(b.fd, v[:])
	_, _ = unix.Write(b.fd, one[:])
}

func (b *bell) close() { _ = b.f.Close() }

var one = [8]byte{1} // an eventfd increment of 1, in host order (little-endian here)

// ringBell rings the peer's doorbell behind fd. A full counter (EAGAIN: the peer filled
// it) makes no edge; that peer only keeps its own sleeper from waking.
func ringBell(fd int) {
	_, _ = unix.Write(fd, one[:])
}

// checkPeerBell checks that fd, received from the peer, is an eventfd, and makes it
// non-blocking: anything else (a pipe, say) could block this side's writes to it.
func checkPeerBell(fd int) error {
	buf := make([]byte, 64)
	n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf)
	if err != nil {
		return fmt.Errorf("shm: inspect the peer's doorbell: %w", err)
	}
	if string(buf[:n]) != "anon_inode:[eventfd]" {
		return fmt.Errorf("peer's doorbell is %q, not an eventfd: %w", buf[:n], ErrProtocol)
	}
	return unix.SetNonblock(fd, true)
}
