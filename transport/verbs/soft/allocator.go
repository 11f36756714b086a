package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// The buffers the soft provider asks a parent domain's allocator for (verbs.Allocator),
// as the resource type of each call.
const (
	// ResQPDoorbell is a QP's doorbell record: its send and receive queue tails.
	ResQPDoorbell verbs.ResourceType = 1
	// ResSRQDoorbell is a shared receive queue's doorbell record: its tail.
	ResSRQDoorbell verbs.ResourceType = 2
)

// A doorbell record's size and alignment: one cache line.
const (
	DoorbellSize  = 64
	DoorbellAlign = 64
)

// doorbell is a QP's or SRQ's doorbell record, kept only by the objects of a parent domain
// with an allocator (elsewhere the counters live in the object alone): every post writes
// the queue tails there, under the object's mu, as a NIC's doorbell record is written.
// Its memory is the allocator's until free; with verbs.ErrUseDefault it is the provider's.
type doorbell struct {
	buf   []byte
	alloc verbs.Allocator // gave buf and takes it back; nil: the provider's own (or none)
	typ   verbs.ResourceType
}

// newDoorbell asks a for a doorbell record of type typ and zeroes it. An allocator error
// fails the verb (ErrNoMemory); memory that is too short or misaligned is given back and
// fails it too (ErrInvalid), naming what came.
func newDoorbell(a verbs.Allocator, typ verbs.ResourceType) (doorbell, error) {
	buf, err := a.Alloc(DoorbellSize, DoorbellAlign, typ)
	switch {
	case errors.Is(err, verbs.ErrUseDefault):
		return doorbell{buf: make([]byte, DoorbellSize), typ: typ}, nil
	case err != nil:
		return doorbell{}, fmt.Errorf("soft: allocator: %d bytes for resource type %d: %w: %w", DoorbellSize, typ, verbs.ErrNoMemory, err)
	case len(buf) < DoorbellSize || uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%DoorbellAlign != 0:
		a.Free(buf, typ)
		return doorbell{}, fmt.Errorf("soft: allocator: gave %d bytes at %p for resource type %d, want %d aligned to %d: %w",
			len(buf), unsafe.SliceData(buf), typ, DoorbellSize, DoorbellAlign, verbs.ErrInvalid)
	}
	buf = buf[:DoorbellSize:DoorbellSize]
	clear(buf)
	return doorbell{buf: buf, alloc: a, typ: typ}, nil
}

// ring records the tails of the send and receive queues; a doorbell without memory
// records nothing.
func (d *doorbell) ring(send, recv uint64) {
	if d.buf != nil {
		binary.LittleEndian.PutUint64(d.buf[0:], send)
		binary.LittleEndian.PutUint64(d.buf[8:], recv)
	}
}

// free gives the memory back to the allocator that gave it, once.
func (d *doorbell) free() {
	if d.alloc != nil {
		d.alloc.Free(d.buf, d.typ)
	}
	*d = doorbell{}
}
