package verbs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// sharedSeals are the seals of a shared mapping's memfd: its size can no longer change, so
// a process it was passed to can map it without the risk of faulting on pages truncated
// under its mapping, and no seal can be added (or, as ever, removed).
const sharedSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// mapShared maps n bytes of a new memfd, sealed against resizing, and returns the mapping
// and the descriptor (open until unmapShared), which a same-host fabric passes to its
// peer. Huge pages come from a hugetlbfs-backed memfd (MFD_HUGETLB).
func mapShared(n int, huge bool) ([]byte, int, error) {
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	if huge {
		flags |= unix.MFD_HUGETLB
	}
	fd, err := unix.MemfdCreate("mwrpc-registered", flags)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		_ = unix.Close(fd)
		return nil, -1, fmt.Errorf("size the memfd to %d bytes: %w", n, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sharedSeals); err != nil {
		_ = unix.Close(fd)
		return nil, -1, fmt.Errorf("seal the memfd: %w", err)
	}
	b, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return nil, -1, fmt.Errorf("mmap the memfd: %w", err)
	}
	return b, fd, nil
}

// unmapShared releases what mapShared mapped, and its descriptor.
func unmapShared(b []byte, fd int) error {
	err := unix.Munmap(b)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	return err
}
