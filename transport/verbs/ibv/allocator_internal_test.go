//go:build ibverbs && linux && cgo

package ibv

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// scriptedAllocator answers Alloc as told and records Free.
type scriptedAllocator struct {
	buf   []byte
	err   error
	panic bool
	freed []verbs.ResourceType
}

func (a *scriptedAllocator) Alloc(size, alignment int, typ verbs.ResourceType) ([]byte, error) {
	if a.panic {
		panic("scripted")
	}
	return a.buf, a.err
}

func (a *scriptedAllocator) Free(buf []byte, typ verbs.ResourceType) { a.freed = append(a.freed, typ) }

// alignedBytes returns n bytes of 0xff at a 64-byte boundary, plus off.
func alignedBytes(n, off int) []byte {
	raw := make([]byte, n+128)
	i := 64 - int(uintptr(unsafe.Pointer(&raw[0]))%64)
	b := raw[i+off : i+off+n]
	for j := range b {
		b[j] = 0xff
	}
	return b
}

// TestParentAllocAnswers: the Go side of the allocator callbacks, without a device: what
// each answer of the application's allocator becomes for libibverbs (memory, zeroed and
// pinned until free; IBV_ALLOCATOR_USE_DEFAULT; NULL), and that bad memory and panics
// fail the verb without crossing into C.
func TestParentAllocAnswers(t *testing.T) {
	const typ = verbs.ResourceType(7)
	for _, tc := range []struct {
		name      string
		a         *scriptedAllocator
		want      allocAnswer
		wantFreed int // by the check itself: bad memory given back
	}{
		{"memory", &scriptedAllocator{buf: alignedBytes(256, 0)}, allocOK, 0},
		{"use default", &scriptedAllocator{err: verbs.ErrUseDefault}, allocDefault, 0},
		{"use default, wrapped", &scriptedAllocator{err: errors.Join(errors.New("huge pages gone"), verbs.ErrUseDefault)}, allocDefault, 0},
		{"failure", &scriptedAllocator{err: errors.New("out of huge pages")}, allocFail, 0},
		{"misaligned", &scriptedAllocator{buf: alignedBytes(256, 8)}, allocFail, 1},
		{"too short", &scriptedAllocator{buf: alignedBytes(100, 0)}, allocFail, 1},
		{"panic", &scriptedAllocator{panic: true}, allocFail, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa := newParentAlloc(tc.a)
			defer pa.close()
			p, ans := pa.allocLogged(256, 64, typ)
			if ans != tc.want {
				t.Fatalf("answer %d, want %d", ans, tc.want)
			}
			if len(tc.a.freed) != tc.wantFreed {
				t.Fatalf("%d buffers given back by the check, want %d", len(tc.a.freed), tc.wantFreed)
			}
			if ans != allocOK {
				if p != nil {
					t.Fatalf("pointer %p with answer %d", p, ans)
				}
				return
			}
			if p != unsafe.Pointer(&tc.a.buf[0]) {
				t.Fatalf("pointer %p, want the allocator's %p", p, &tc.a.buf[0])
			}
			for i, v := range tc.a.buf {
				if v != 0 {
					t.Fatalf("byte %d is %#x: want the buffer zeroed before C has it", i, v)
				}
			}
			if len(pa.live) != 1 {
				t.Fatalf("%d buffers held for C, want 1", len(pa.live))
			}
			pa.freeLogged(unsafe.Pointer(&tc.a.buf[8]), typ) // not one C was given: ignored
			pa.freeLogged(p, typ)
			if len(pa.live) != 0 || len(tc.a.freed) != 1 || tc.a.freed[0] != typ {
				t.Fatalf("after free: %d held, frees %v; want 0 held and one free of type %d", len(pa.live), tc.a.freed, typ)
			}
		})
	}
}
