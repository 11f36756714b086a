//go:build ibverbs && linux && cgo

package ibv

/*
#include "mwibv.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"log"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// parentAlloc carries a parent domain's custom allocator (verbs.Allocator) across cgo.
//
// How the callbacks cross: ibv_parent_domain_init_attr's pd_context is a cgo.Handle of the
// parentAlloc (a number, not a Go pointer, so C may keep it); libibverbs calls the C
// trampolines in mwibv.c inside ibv_create_qp, ibv_destroy_qp and the like, on the thread
// of the goroutine that called the verb, and they call mwibvGoAlloc and mwibvGoFree. What
// Alloc returns may be Go memory: it is pinned (runtime.Pinner) from the moment it is
// handed to C until Free gives it back, which the cgo pointer rules require of Go memory
// that C keeps, and it is zeroed first. A panic in the allocator must not unwind through
// C frames: it is recovered and fails the verb (NULL), logged. The handle is deleted
// when the parent domain is deallocated, after which libibverbs calls nothing on it.
type parentAlloc struct {
	a      verbs.Allocator
	handle cgo.Handle

	mu   sync.Mutex
	live map[uintptr]pinnedBuf // by the address handed to C
}

// allocAnswer is what the Go allocator answered, as the C trampoline reads it.
type allocAnswer C.int

const (
	allocOK      allocAnswer = C.MWIBV_ALLOC_OK      // memory: *out
	allocDefault allocAnswer = C.MWIBV_ALLOC_DEFAULT // IBV_ALLOCATOR_USE_DEFAULT
	allocFail    allocAnswer = C.MWIBV_ALLOC_FAIL    // NULL: the verb fails
)

// pinnedBuf is a buffer C holds, and its pin.
type pinnedBuf struct {
	buf []byte
	pin *runtime.Pinner
}

func newParentAlloc(a verbs.Allocator) *parentAlloc {
	pa := &parentAlloc{a: a, live: map[uintptr]pinnedBuf{}}
	pa.handle = cgo.NewHandle(pa)
	return pa
}

// close deletes the handle; pa may be nil. Buffers still live (a provider that did not
// free them all) stay pinned: C may still use them.
func (pa *parentAlloc) close() {
	if pa != nil {
		pa.handle.Delete()
	}
}

// alloc asks the allocator for a buffer, checks it, zeroes and pins it.
func (pa *parentAlloc) alloc(size, align int, typ verbs.ResourceType) (unsafe.Pointer, allocAnswer, error) {
	buf, err := pa.a.Alloc(size, align, typ)
	switch {
	case errors.Is(err, verbs.ErrUseDefault):
		return nil, allocDefault, nil
	case err != nil:
		return nil, allocFail, err
	case len(buf) < size || size == 0 || align > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%uintptr(align) != 0:
		pa.a.Free(buf, typ)
		return nil, allocFail, fmt.Errorf("gave %d bytes at %p, want %d aligned to %d: %w", len(buf), unsafe.SliceData(buf), size, align, verbs.ErrInvalid)
	}
	buf = buf[:size:size]
	clear(buf)
	p := unsafe.Pointer(unsafe.SliceData(buf))
	pin := new(runtime.Pinner)
	pin.Pin(p)
	pa.mu.Lock()
	pa.live[uintptr(p)] = pinnedBuf{buf: buf, pin: pin}
	pa.mu.Unlock()
	return p, allocOK, nil
}

// allocLogged is alloc for the C trampoline: an error is logged (the verb's own error
// says only ENOMEM), and a panic recovered and logged, since it must not unwind through
// C frames; either fails the verb.
func (pa *parentAlloc) allocLogged(size, align int, typ verbs.ResourceType) (p unsafe.Pointer, ans allocAnswer) {
	defer func() {
		if r := recover(); r != nil {
			log.Printf("mwrpc: ibv: parent domain allocator panicked (the verb fails): %v", r)
			p, ans = nil, allocFail
		}
	}()
	p, ans, err := pa.alloc(size, align, typ)
	if err != nil {
		log.Printf("mwrpc: ibv: parent domain allocator: %d bytes for resource type %#x: %v", size, uint64(typ), err)
	}
	return p, ans
}

// freeLogged is free for the C trampoline: a panic in the allocator's Free is recovered
// and logged.
func (pa *parentAlloc) freeLogged(p unsafe.Pointer, typ verbs.ResourceType) {
	defer func() {
		if r := recover(); r != nil {
			log.Printf("mwrpc: ibv: parent domain allocator's Free panicked: %v", r)
		}
	}()
	pa.free(p, typ)
}

// free unpins a buffer C gave back and returns it to the allocator.
func (pa *parentAlloc) free(p unsafe.Pointer, typ verbs.ResourceType) {
	pa.mu.Lock()
	b, ok := pa.live[uintptr(p)]
	delete(pa.live, uintptr(p))
	pa.mu.Unlock()
	if !ok {
		return // not ours: the provider's default buffer is never passed to free
	}
	b.pin.Unpin()
	pa.a.Free(b.buf, typ)
}

//export mwibvGoAlloc
func mwibvGoAlloc(h C.uintptr_t, size, align C.size_t, typ C.uint64_t, out *unsafe.Pointer) C.int {
	p, ans := cgo.Handle(h).Value().(*parentAlloc).allocLogged(int(size), int(align), verbs.ResourceType(typ))
	*out = p
	return C.int(ans)
}

//export mwibvGoFree
func mwibvGoFree(h C.uintptr_t, p unsafe.Pointer, typ C.uint64_t) {
	cgo.Handle(h).Value().(*parentAlloc).freeLogged(p, verbs.ResourceType(typ))
}
