//go:build unix && !linux

package verbs

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
)

// mapCall names the system call that maps Memory, for Map's errors.
const mapCall = "mmap"

// mapAnon maps n bytes of private anonymous memory. Huge pages are refused: macOS and the
// BSDs have no MAP_HUGETLB (FreeBSD promotes to superpages on its own, macOS only through
// Mach calls), so a request for them fails and the caller's fallback maps normal pages.
func mapAnon(n int, huge bool) ([]byte, error) {
	if huge {
		return nil, fmt.Errorf("huge pages (MAP_HUGETLB) are Linux's, not on %s: %w", runtime.GOOS, errors.ErrUnsupported)
	}
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
}

// unmapAnon releases what mapAnon mapped.
func unmapAnon(b []byte) error { return syscall.Munmap(b) }
