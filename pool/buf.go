package pool

import (
	"bytes"
	"fmt"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Buf is a buffer from a Pool: Len bytes (at most its class size) of registered memory,
// with the keys and address a work request or a memory window needs.
//
// A Buf is valid from Get until Release. Every method checks that with one atomic load
// and panics with a *MisuseError on a released buffer. In a release build the handle
// itself is reused by the next Get of the same slot, so a stale handle is caught only
// until then; a debug build (tag mwrpcdebug, or -race) gives every Get its own handle and
// catches it always.
type Buf struct {
	s    *slot
	n    uint32 // length of Bytes
	off  uint32 // where Bytes starts in the slot's memory (Slice); 0 from Get
	want uint32 // the slot state while this handle is valid: generation<<1 | in use
}

// MisuseError is the panic value of a misuse of a buffer: a double Release, a use after
// Release, or a write to its memory after Release (seen by the next Get in a debug build).
type MisuseError struct {
	Op   string // the method called, for example "Release" or "Bytes"
	What string // what went wrong
	Buf  string // the buffer: class, slab, slot, address
}

// Error describes the misuse.
func (e *MisuseError) Error() string {
	return fmt.Sprintf("pool: %s: %s (%s)", e.Op, e.What, e.Buf)
}

// check returns b's slot if b is valid, and panics otherwise.
func (b *Buf) check(op string) *slot {
	if b == nil || b.s == nil {
		panic(&MisuseError{Op: op, What: "nil buffer", Buf: "nil"})
	}
	s := b.s
	if wordState(s.word.Load()) != b.want {
		b.fail(op)
	}
	return s
}

// fail panics with a description of why b is not valid.
//
//go:noinline
func (b *Buf) fail(op string) {
	st := wordState(b.s.word.Load())
	var what string
	switch {
	case op == "Release" && st == b.want&^1:
		what = "double Release: the buffer was already released"
	case op == "Release":
		what = "Release of a stale handle: the buffer was released and handed out again since this Get"
	case st == b.want&^1:
		what = "use after Release"
	default:
		what = "use of a stale handle: the buffer was released and handed out again since this Get"
	}
	panic(&MisuseError{Op: op, What: what, Buf: b.s.describe()})
}

// describe names a slot for messages.
func (s *slot) describe() string {
	c := s.slab.c
	return fmt.Sprintf("%s buffer, slab %d slot %d, addr 0x%x", sizeString(int64(c.size)), s.slab.no,
		int(s.ref-1)&(c.count-1), s.addr())
}

// Bytes returns the buffer's memory: Len bytes, with Cap as capacity. The slice aliases
// registered memory and must not be used after Release.
func (b *Buf) Bytes() []byte {
	s := b.check("Bytes")
	return s.bytes()[b.off : b.off+b.n]
}

// Len returns the length of Bytes.
func (b *Buf) Len() int {
	b.check("Len")
	return int(b.n)
}

// Cap returns the most SetLen allows: the class size, less the offset Slice set.
func (b *Buf) Cap() int {
	return int(b.check("Cap").size - b.off)
}

// SetLen sets the length of Bytes (and SGE) to n, 0 <= n <= Cap, for example to the length
// a receive completion reports. The contents are unchanged.
func (b *Buf) SetLen(n int) {
	s := b.check("SetLen")
	if n < 0 || n > int(s.size-b.off) {
		panic(&MisuseError{Op: "SetLen", What: fmt.Sprintf("length %d outside 0..%d", n, s.size-b.off), Buf: s.describe()})
	}
	b.n = uint32(n)
}

// Slice makes the buffer bytes off..off+n of its memory (the class size from its first
// byte, whatever an earlier Slice set): Bytes, Addr, SGE, Len and Cap follow, and a window
// bound over it exposes exactly those bytes. It lets a caller build a message behind room
// left for a header that is written later, in front of it, and send both without a copy.
// The contents are unchanged; Release returns the whole buffer.
func (b *Buf) Slice(off, n int) {
	s := b.check("Slice")
	if off < 0 || n < 0 || off > int(s.size) || n > int(s.size)-off {
		panic(&MisuseError{Op: "Slice", What: fmt.Sprintf("range %d+%d outside 0..%d", off, n, s.size), Buf: s.describe()})
	}
	b.off, b.n = uint32(off), uint32(n)
}

// Addr returns the virtual address of Bytes()[0], the form SGEs and remote addresses use.
func (b *Buf) Addr() uint64 { return b.check("Addr").addr() + uint64(b.off) }

// LKey returns the lkey of the buffer's memory region.
func (b *Buf) LKey() uint32 { return b.check("LKey").slab.lkey }

// RKey returns the rkey of the buffer's memory region. It grants what Config.Access
// grants, on the whole slab; expose a single buffer to a peer through a memory window
// (Windows) instead.
func (b *Buf) RKey() uint32 { return b.check("RKey").slab.rkey }

// MR returns the memory region the buffer lies in (a slab of its class).
func (b *Buf) MR() verbs.MR { return b.check("MR").slab.mr }

// SGE returns the scatter/gather element for the buffer's Len bytes.
func (b *Buf) SGE() verbs.SGE {
	s := b.check("SGE")
	return verbs.SGE{Addr: s.addr() + uint64(b.off), Length: b.n, LKey: s.slab.lkey}
}

// Release returns the buffer to its pool. The buffer and any slice from Bytes must not be
// used afterwards, and the NIC must be done with it: its work requests completed, any
// window over it invalidated. Releasing twice panics with a *MisuseError.
func (b *Buf) Release() {
	s := b.check("Release")
	c := s.slab.c
	if debug {
		fill(s.bytes(), poisonByte)
	}
	if c.p.cfg.TrackLeaks {
		s.taken.Store(nil)
	}
	if !c.releaseSlot(s, b.want) {
		b.fail("Release") // a racing Release won
	}
	if c.waiters.Load() != 0 {
		c.wakeWaiters()
	}
}

// poisonByte fills released buffers in a debug build.
const poisonByte = 0xdb

var poisonPage = bytes.Repeat([]byte{poisonByte}, 4096)

// fill sets every byte of b to v.
func fill(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for n := 1; n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
}

// checkPoison returns a *MisuseError if the memory of s, released in a debug build, was
// written since.
func checkPoison(s *slot) error {
	mem := s.bytes()
	for off := 0; off < len(mem); off += len(poisonPage) {
		chunk := mem[off:min(off+len(poisonPage), len(mem))]
		if bytes.Equal(chunk, poisonPage[:len(chunk)]) {
			continue
		}
		i := 0
		for chunk[i] == poisonByte {
			i++
		}
		return &MisuseError{Op: "Get", What: fmt.Sprintf("write after Release: byte %d of the buffer changed while it was free", off+i), Buf: s.describe()}
	}
	return nil
}
