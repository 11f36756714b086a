package shm

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync/atomic"
	"unsafe"
)

// A ring is one direction of a connection: a single-producer, single-consumer byte ring in
// memory both processes map. The consumer creates it (a sealed memfd, see conn_linux.go)
// and the producer maps the file it is handed. Layout, little-endian, each part on its own
// cache line so that the two sides do not write the same line:
//
//	0    magic "MWSHMRNG" | version u32 | log2 of the data size u32   (creator, once)
//	64   tail u64: bytes ever written          | spaceWaiter u32 (producer)
//	128  head u64: bytes ever read             | dataWaiter u32  (consumer)
//	4096 data, 1<<log2 bytes: byte i of the stream at data[i mod size]
//
// Each side keeps its own position (the producer's tail, the consumer's head) in private
// memory and only publishes it: what it reads back from the shared page is the peer's
// position alone, and that is input from a peer. The consumer refuses a tail that is more
// than size ahead of its head, or behind it; the producer refuses a head ahead of its tail
// or more than size behind it (ErrProtocol). The stream's bytes are copied out before
// anything parses them, so a peer that rewrites them afterwards changes nothing.
//
// A waiter flag is set by the side that is about to sleep (the consumer on an empty ring,
// the producer on a full one) and taken (swapped to 0) by the other side after it moves
// its position: if it was set, that side rings the sleeper's doorbell. The order is
// Dekker's: the sleeper stores its flag, then loads the peer's position; the mover stores
// its position, then loads the flag (sync/atomic operations are sequentially consistent,
// on x86 the stores are locked exchanges). Of the two loads at least one sees the other
// side's store: the sleeper finds the ring ready and does not sleep, or the mover finds the
// flag and rings. So a wake-up is never lost, and a doorbell is written only when the peer
// has said it sleeps: while it polls, any number of entries cross without one. A peer that
// sets a flag falsely costs only a doorbell write; one that clears the flag of a sleeper
// it should wake only delays that sleeper as a silent peer would; neither can lose or
// repeat a byte of the ring, whose positions are checked on every access.
const (
	ringMagic   = "MWSHMRNG"
	ringVersion = 1

	offMagic       = 0
	offVersion     = 8
	offLog2        = 12
	offTail        = 64
	offSpaceWaiter = 72
	offHead        = 128
	offDataWaiter  = 136
	ringHeaderLen  = 4096

	// MinRingSize and MaxRingSize bound a ring's data size, the ring a peer asks this
	// side to map included.
	MinRingSize = 4 << 10
	MaxRingSize = 64 << 20
)

// ringFileSize is the size of a ring's file with size bytes of data.
func ringFileSize(size int) int { return ringHeaderLen + size }

// initRing writes the header of a new ring of size bytes (a power of two) into mem, which
// the creator has just mapped zeroed.
func initRing(mem []byte, size int) {
	copy(mem[offMagic:], ringMagic)
	binary.LittleEndian.PutUint32(mem[offVersion:], ringVersion)
	binary.LittleEndian.PutUint32(mem[offLog2:], uint32(log2(size)))
}

// checkRingHeader checks the header of a ring the peer created against the size its hello
// announced: the magic, the version and the size must match.
func checkRingHeader(mem []byte, size int) error {
	if len(mem) != ringFileSize(size) {
		return fmt.Errorf("ring mapping is %d bytes, want %d: %w", len(mem), ringFileSize(size), ErrProtocol)
	}
	if string(mem[offMagic:offMagic+len(ringMagic)]) != ringMagic {
		return fmt.Errorf("ring magic %q, want %q: %w", mem[offMagic:offMagic+len(ringMagic)], ringMagic, ErrProtocol)
	}
	if v := binary.LittleEndian.Uint32(mem[offVersion:]); v != ringVersion {
		return fmt.Errorf("ring version %d, this side speaks %d: %w", v, ringVersion, ErrProtocol)
	}
	if l := binary.LittleEndian.Uint32(mem[offLog2:]); l != uint32(log2(size)) {
		return fmt.Errorf("ring header says 1<<%d bytes, the hello %d: %w", l, size, ErrProtocol)
	}
	return nil
}

// validRingSize reports whether size is a power of two within [MinRingSize, MaxRingSize].
func validRingSize(size int) bool {
	return size >= MinRingSize && size <= MaxRingSize && size&(size-1) == 0
}

func log2(n int) int {
	l := 0
	for n > 1 {
		n >>= 1
		l++
	}
	return l
}

// ring is one side's view of a ring: the producer's or the consumer's. It is not safe for
// concurrent use; the connection serializes readers and writers.
type ring struct {
	data []byte
	size uint64
	mask uint64
	pos  uint64 // this side's position: tail for the producer, head for the consumer

	tail, head              *atomic.Uint64
	spaceWaiter, dataWaiter *atomic.Uint32
}

// newRing views mem (a ring's whole mapping, header checked or written) as a ring of
// size bytes. mem must be 8-byte aligned (a mapping is page-aligned).
func newRing(mem []byte, size int) *ring {
	at := func(off int) unsafe.Pointer { return unsafe.Pointer(&mem[off]) }
	return &ring{
		data:        mem[ringHeaderLen : ringHeaderLen+size : ringHeaderLen+size],
		size:        uint64(size),
		mask:        uint64(size - 1),
		tail:        (*atomic.Uint64)(at(offTail)),
		head:        (*atomic.Uint64)(at(offHead)),
		spaceWaiter: (*atomic.Uint32)(at(offSpaceWaiter)),
		dataWaiter:  (*atomic.Uint32)(at(offDataWaiter)),
	}
}

// readable returns how many bytes the consumer may read: the peer's published tail less
// this side's head, refused when it is not within [0, size].
func (r *ring) readable() (uint64, error) {
	t := r.tail.Load()
	n := t - r.pos // wraps to a huge value when the tail is behind the head
	if n > r.size {
		return 0, fmt.Errorf("ring tail %d is not within [head %d, head+%d]: %w", t, r.pos, r.size, ErrProtocol)
	}
	return n, nil
}

// read copies up to len(p) readable bytes into p, publishes the new head and returns how
// many it copied (0 when the ring is empty).
func (r *ring) read(p []byte) (int, error) {
	avail, err := r.readable()
	if err != nil || avail == 0 {
		return 0, err
	}
	n := min(uint64(len(p)), avail)
	off := r.pos & r.mask
	c := copy(p[:n], r.data[off:])
	copy(p[c:n], r.data)
	r.pos += n
	r.head.Store(r.pos)
	return int(n), nil
}

// writable returns how many bytes the producer may write: size less what the peer's
// published head says is unread, refused when the head is ahead of this side's tail or
// more than size behind it.
func (r *ring) writable() (uint64, error) {
	h := r.head.Load()
	used := r.pos - h
	if used > r.size {
		return 0, fmt.Errorf("ring head %d is not within [tail-%d, tail %d]: %w", h, r.size, r.pos, ErrProtocol)
	}
	return r.size - used, nil
}

// write copies as much of p as fits, publishes the new tail and returns how many bytes it
// copied (0 when the ring is full).
func (r *ring) write(p []byte) (int, error) {
	v := net.Buffers{p}
	return r.writeBuffers(&v)
}

// writeBuffers copies as much of v's bytes as fit, in order, publishes the new tail once
// and returns how many bytes it copied (0 when the ring is full). It consumes what it
// copied from v, as net.Buffers.WriteTo does: written buffers are dropped, a buffer
// written in part is cut to its rest, empty ones are dropped.
func (r *ring) writeBuffers(v *net.Buffers) (int, error) {
	space, err := r.writable()
	if err != nil {
		return 0, err
	}
	for len(*v) > 0 && len((*v)[0]) == 0 {
		*v = (*v)[1:]
	}
	if space == 0 || len(*v) == 0 {
		return 0, nil
	}
	start := r.pos
	for len(*v) > 0 && r.pos-start < space {
		b := (*v)[0]
		n := min(uint64(len(b)), space-(r.pos-start))
		off := r.pos & r.mask
		c := copy(r.data[off:], b[:n])
		copy(r.data, b[c:n])
		r.pos += n
		if n < uint64(len(b)) {
			(*v)[0] = b[n:]
			break
		}
		(*v)[0] = nil // no reference kept to memory the caller may reuse
		*v = (*v)[1:]
	}
	r.tail.Store(r.pos)
	return int(r.pos - start), nil
}

// takeWaiter takes a waiter flag after this side moved its position: it reports whether the
// peer had set it (it sleeps, or is about to: ring its doorbell). The plain load first keeps
// the common case, a peer that is awake, a read of the peer's cache line rather than a
// locked write that would take the line from it on every entry.
func takeWaiter(w *atomic.Uint32) bool {
	return w.Load() != 0 && w.Swap(0) != 0
}
