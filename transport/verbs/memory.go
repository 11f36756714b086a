package verbs

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"unsafe"
)

// Memory is an anonymous mapping outside the Go heap, the only memory RegMR accepts. The
// garbage collector never moves or frees it; Unmap does, and refuses while any memory
// region is registered over it. Each OS maps it its own way (memory_linux.go,
// memory_unix.go, memory_windows.go): mmap on Linux and the BSDs and macOS, VirtualAlloc on
// Windows; huge pages are Linux's alone.
type Memory struct {
	b    []byte
	addr uintptr
	huge bool
	fd   int // the memfd behind a shared mapping (MapOptions.Shared), else -1

	mu     sync.Mutex
	pins   int // registrations over this mapping
	closed bool
}

// MapOptions tune Map.
type MapOptions struct {
	// HugePages asks for MAP_HUGETLB. Map fails (wrapping ErrNoMemory) when the system has
	// no huge pages to give, and on every OS but Linux (wrapping errors.ErrUnsupported as
	// well); callers that want a fallback retry without it.
	HugePages bool
	// Shared backs the mapping with a sealed memfd (Linux) that a same-host fabric may pass
	// to its peer, so that the peer's NIC code copies into or out of it directly (see
	// transport/verbs/shm). Off Linux, or if the memfd cannot be made, the mapping is
	// private, as without it: sharing is an optimization, never a requirement.
	Shared bool
}

var mappings struct {
	sync.RWMutex
	byAddr []*Memory // sorted by addr
}

// Map maps n bytes of zeroed, page-aligned memory outside the Go heap.
func Map(n int, opt MapOptions) (*Memory, error) {
	if n <= 0 {
		return nil, fmt.Errorf("verbs: map %d bytes: %w", n, ErrInvalid)
	}
	b, fd, err := []byte(nil), -1, error(nil)
	if opt.Shared {
		b, fd, err = mapShared(n, opt.HugePages)
	}
	if b == nil {
		b, err = mapAnon(n, opt.HugePages)
	}
	if err != nil {
		return nil, fmt.Errorf("verbs: %s %d bytes (huge pages %v): %w: %w", mapCall, n, opt.HugePages, ErrNoMemory, err)
	}
	m := &Memory{b: b, addr: uintptr(unsafe.Pointer(&b[0])), huge: opt.HugePages, fd: fd}
	mappings.Lock()
	i := sort.Search(len(mappings.byAddr), func(i int) bool { return mappings.byAddr[i].addr > m.addr })
	mappings.byAddr = append(mappings.byAddr, nil)
	copy(mappings.byAddr[i+1:], mappings.byAddr[i:])
	mappings.byAddr[i] = m
	mappings.Unlock()
	return m, nil
}

// Bytes returns the mapped memory. It is valid until Unmap.
func (m *Memory) Bytes() []byte { return m.b }

// HugePages reports whether the mapping uses huge pages.
func (m *Memory) HugePages() bool { return m.huge }

// SharedFile returns the descriptor of the sealed memfd behind a shared mapping
// (MapOptions.Shared), valid until Unmap, or -1 for a private one. A fabric that passes it
// to a peer (SCM_RIGHTS) gives the peer its own reference: the peer's mapping outlives
// Unmap, and what it writes there afterwards reaches no one.
func (m *Memory) SharedFile() int { return m.fd }

// Unmap releases the mapping. It fails with ErrBusy while a memory region is registered
// over it, and with ErrClosed the second time.
func (m *Memory) Unmap() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("verbs: unmap: %w", ErrClosed)
	}
	if m.pins > 0 {
		return fmt.Errorf("verbs: unmap: %d memory regions still registered: %w", m.pins, ErrBusy)
	}
	mappings.Lock()
	for i, x := range mappings.byAddr {
		if x == m {
			mappings.byAddr = append(mappings.byAddr[:i], mappings.byAddr[i+1:]...)
			break
		}
	}
	mappings.Unlock()
	m.closed = true
	if m.fd >= 0 {
		return unmapShared(m.b, m.fd)
	}
	return unmapAnon(m.b)
}

// Pin finds the live mapping that contains all of buf and counts one registration against
// it, so that it cannot be unmapped until Unpin. Providers call it from RegMR. It fails
// with ErrNotMapped for memory that did not come from Map (the Go heap, for instance).
func Pin(buf []byte) (*Memory, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("verbs: register 0 bytes: %w", ErrInvalid)
	}
	start := uintptr(unsafe.Pointer(&buf[0]))
	m, _, ok := Lookup(buf)
	if !ok {
		return nil, fmt.Errorf("verbs: register %d bytes at 0x%x: %w (allocate registered memory with verbs.Map; Go heap memory may be freed under the NIC)", len(buf), start, ErrNotMapped)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("verbs: register: mapping was unmapped: %w", ErrNotMapped)
	}
	m.pins++
	return m, nil
}

// Lookup returns the live mapping (from Map) that contains all of buf, and buf's offset
// in it; false when none does. It pins nothing: the caller holds buf's registration.
func Lookup(buf []byte) (*Memory, int, bool) {
	if len(buf) == 0 {
		return nil, 0, false
	}
	start := uintptr(unsafe.Pointer(&buf[0]))
	end := start + uintptr(len(buf))
	mappings.RLock()
	defer mappings.RUnlock()
	i := sort.Search(len(mappings.byAddr), func(i int) bool { return mappings.byAddr[i].addr > start }) - 1
	if i < 0 {
		return nil, 0, false
	}
	c := mappings.byAddr[i]
	if end > c.addr+uintptr(len(c.b)) {
		return nil, 0, false
	}
	return c, int(start - c.addr), true
}

// Unpin drops one registration counted by Pin.
func (m *Memory) Unpin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pins <= 0 {
		panic(errors.New("verbs: Memory.Unpin without Pin"))
	}
	m.pins--
}

// AddrOf returns the virtual address of b[0], the form SGEs and remote addresses use.
func AddrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}
