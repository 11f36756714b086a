package shm

import (
	"fmt"
	"net"
	"time"

	"github.com/mwrpc/mwrpc/internal/parcopy"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
	"golang.org/x/sys/unix"
)

// Shared registered memory: a placed READ (soft.SharedMemoryWire) copies once, from the
// responder's memory straight into the requester's (a placed WRITE or SEND, from the
// sender's into the target's). The requester's registered memory must be a shared mapping
// (verbs.MapOptions.Shared: a sealed memfd); the first READ into a mapping on this
// connection (or WRITE or SEND from it) announces it to the peer (its descriptor over the
// socket, control.go), never earlier, and goes the ring's way, as every READ into it does
// until the peer answers that it mapped it. Memory is shared only with a peer of
// this process's own user unless Config says otherwise (Config.sharesWith).
//
// Lifetimes: the peer's regions stay mapped here until Close, which waits for a copy in
// progress (peerMu). What this side announced stays announced until Close too: a mapping
// unmapped meanwhile is never named again (its Memory is not reused), and the peer's
// mapping of it, which holds its pages, ends with the connection.

// localRegion is a mapping of ours announced to the peer.
type localRegion struct {
	id     uint32
	mapped bool // the peer answered that it mapped it
}

// peerRegion is a mapping of the peer's, mapped here.
type peerRegion struct {
	mem []byte
}

var _ soft.SharedMemoryWire = (*Conn)(nil)

// ShareLocal returns where the peer finds buf once the mapping that holds buf is shared
// and mapped by the peer. The first call for a shared mapping announces it and returns
// false. It never waits: an announcement the socket cannot take now is tried again later.
func (c *Conn) ShareLocal(buf []byte) (soft.Placement, bool) {
	m, off, ok := verbs.Lookup(buf)
	if !ok || m.SharedFile() < 0 || !c.shares || c.sticky() != nil || c.peerGone.Load() {
		return soft.Placement{}, false
	}
	c.shareMu.Lock()
	defer c.shareMu.Unlock()
	if r := c.announced[m]; r != nil {
		return soft.Placement{Region: r.id, Offset: uint64(off)}, r.mapped
	}
	if len(c.announced) >= maxRegions {
		return soft.Placement{}, false
	}
	id := uint32(len(c.announced))
	if !c.announce(control{id: id, size: uint64(len(m.Bytes()))}, m.SharedFile()) {
		return soft.Placement{}, false
	}
	if c.announced == nil {
		c.announced = make(map[*verbs.Memory]*localRegion)
	}
	c.announced[m] = &localRegion{id: id}
	return soft.Placement{}, false
}

// announce sends a region's announcement with its descriptor, without waiting: false when
// the socket cannot take it now. shareMu is held.
func (c *Conn) announce(m control, fd int) bool {
	rc, err := c.sock.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	msg := appendControl(make([]byte, 0, controlLen), m)
	if err := rc.Control(func(s uintptr) {
		serr = unix.Sendmsg(int(s), msg, unix.UnixRights(fd), nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	}); err != nil {
		return false
	}
	return serr == nil
}

// CopyToPeer copies src into the peer's region at dst, after checking that the region was
// announced and mapped and that the range is inside it.
func (c *Conn) CopyToPeer(dst soft.Placement, src []byte) error {
	c.peerMu.RLock()
	defer c.peerMu.RUnlock()
	mem, err := c.peerRange(dst, len(src), "READ")
	if err == nil {
		parcopy.Copy(mem, src)
	}
	return err
}

// CopyFromPeer copies len(dst) bytes of the peer's region at src into dst, after the same
// checks.
func (c *Conn) CopyFromPeer(dst []byte, src soft.Placement) error {
	c.peerMu.RLock()
	defer c.peerMu.RUnlock()
	mem, err := c.peerRange(src, len(dst), "WRITE or SEND")
	if err == nil {
		parcopy.Copy(dst, mem)
	}
	return err
}

// PeerCopies implements soft.SharedMemoryWire: the next read's wait polls for as long as
// copying n more bytes takes (copyTime).
func (c *Conn) PeerCopies(n int) {
	c.peerCopy.Add(1<<copyCountShift | int64(min(max(n, 0), maxCopyBytes)))
}

// takePeerCopy returns how long the peer's copies announced since the last call take, and
// how many there were, and forgets them.
func (c *Conn) takePeerCopy() (time.Duration, int) {
	v := c.peerCopy.Swap(0)
	return copyTime(v & (1<<copyCountShift - 1)), int(v >> copyCountShift)
}

// copyCountShift splits peerCopy: the copies announced above it, their bytes below, each
// copy's counted up to maxCopyBytes (far more than maxCopySpin covers), so that 256 of them
// fit below it before the next wait takes them.
const (
	copyCountShift = 40
	maxCopyBytes   = 1 << 32
)

// peerRange returns n bytes of the peer's shared memory at p, refusing (ErrProtocol) a
// region the peer did not announce or a range outside it. peerMu is held for reading.
func (c *Conn) peerRange(p soft.Placement, n int, what string) ([]byte, error) {
	// A peer that closed or failed the connection may have flushed the READ and reused its
	// destination: a request it sent before that is not executed. (A copy already under
	// way when it went is not stopped: its destination must not be reused until this
	// side's end closes, which a transport learns only from the stream; docs/security.md.)
	if c.peerClosed || c.peerGone.Load() || c.sticky() != nil {
		return nil, net.ErrClosed
	}
	if int(p.Region) >= len(c.peerRegions) || p.Region >= maxRegions {
		return nil, fmt.Errorf("a placed %s names region %d, the peer announced %d: %w", what, p.Region, len(c.peerRegions), ErrProtocol)
	}
	mem := c.peerRegions[p.Region].mem
	if p.Offset > uint64(len(mem)) || uint64(n) > uint64(len(mem))-p.Offset {
		return nil, fmt.Errorf("a placed %s of %d bytes at offset %d of region %d (%d bytes): %w", what, n, p.Offset, p.Region, len(mem), ErrProtocol)
	}
	return mem[p.Offset : p.Offset+uint64(n)], nil
}

// onControl handles one control message from the peer (the watcher's goroutine).
func (c *Conn) onControl(b []byte, fds []int) error {
	m, err := parseControl(b, len(fds))
	if err != nil {
		return err
	}
	if m.mapped {
		return c.onMapped(m)
	}
	mem, err := mapPeerRegion(fds[0], m.size)
	if err != nil {
		return fmt.Errorf("region %d: %w", m.id, err)
	}
	c.peerMu.Lock()
	if c.peerClosed || int(m.id) != len(c.peerRegions) {
		n := len(c.peerRegions)
		c.peerMu.Unlock()
		_ = unix.Munmap(mem)
		return fmt.Errorf("region id %d announced, want %d: %w", m.id, n, ErrProtocol)
	}
	c.peerRegions = append(c.peerRegions, peerRegion{mem: mem})
	c.peerMu.Unlock()
	m.mapped = true
	if _, err := c.sock.Write(appendControl(make([]byte, 0, controlLen), m)); err != nil {
		return fmt.Errorf("answer region %d: %w", m.id, err)
	}
	return nil
}

// onMapped records the peer's answer that it mapped one of our regions.
func (c *Conn) onMapped(m control) error {
	c.shareMu.Lock()
	defer c.shareMu.Unlock()
	for mm, r := range c.announced {
		if r.id == m.id && !r.mapped && uint64(len(mm.Bytes())) == m.size {
			r.mapped = true
			return nil
		}
	}
	return fmt.Errorf("the peer answers for region %d (%d bytes), which is not ours or answered: %w", m.id, m.size, ErrProtocol)
}

// mapPeerRegion maps a region the peer announced, once its file is what it should be: a
// memfd sealed against shrinking (so that a copy into it never faults on a truncated
// page) of exactly the announced size. fd stays the caller's.
func mapPeerRegion(fd int, size uint64) ([]byte, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("not a memfd (F_GET_SEALS: %v): %w", err, ErrProtocol)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("memfd with seals 0x%x, not sealed against shrinking: %w", seals, ErrProtocol)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: fstat the peer's region: %w", err)
	}
	if st.Size < 0 || uint64(st.Size) != size {
		return nil, fmt.Errorf("file of %d bytes announced as %d: %w", st.Size, size, ErrProtocol)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: map the peer's region (%d bytes): %w", size, err)
	}
	return mem, nil
}

// releasePeerRegions unmaps the peer's regions once no copy uses them.
func (c *Conn) releasePeerRegions() {
	c.peerMu.Lock()
	defer c.peerMu.Unlock()
	c.peerClosed = true
	for _, r := range c.peerRegions {
		_ = unix.Munmap(r.mem)
	}
	c.peerRegions = nil
}
