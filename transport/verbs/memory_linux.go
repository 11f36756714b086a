package verbs

import "syscall"

// mapCall names the system call that maps Memory, for Map's errors.
const mapCall = "mmap"

// mapAnon maps n bytes of private anonymous memory, on huge pages (MAP_HUGETLB) if asked.
func mapAnon(n int, huge bool) ([]byte, error) {
	flags := syscall.MAP_PRIVATE | syscall.MAP_ANON
	if huge {
		flags |= syscall.MAP_HUGETLB
	}
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, flags)
}

// unmapAnon releases what mapAnon mapped.
func unmapAnon(b []byte) error { return syscall.Munmap(b) }
