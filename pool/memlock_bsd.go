//go:build darwin || dragonfly || freebsd || netbsd || openbsd

package pool

import "golang.org/x/sys/unix"

// memlockHint says how to raise the locked-memory limit on macOS and the BSDs.
const memlockHint = "raise the limit with `ulimit -l unlimited` (or a size in KiB) in the shell that starts the process, " +
	"`launchctl limit memlock` on macOS, or the memorylocked capability in /etc/login.conf on the BSDs"

// hugePagesHint says why huge pages are not used on macOS and the BSDs.
const hugePagesHint = "huge pages (MAP_HUGETLB) are Linux's"

// lockCall names the system call lockMemory makes, for errors.
const lockCall = "mlock"

// limitString says what the locked-memory limit lim is.
func limitString(lim uint64) string { return rlimitString(lim) }

// memlockLimit returns the soft RLIMIT_MEMLOCK in bytes. RLIM_INFINITY is 1<<63-1 here,
// not Linux's ^0; it reads as unlimited. It goes through golang.org/x/sys/unix, not
// syscall: FreeBSD's syscall package has no Mlock, and OpenBSD allows system calls only
// through libc.
func memlockLimit() uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return unlimited
	}
	if uint64(r.Cur) >= 1<<63-1 {
		return unlimited
	}
	return uint64(r.Cur)
}

// hasCapIPCLock reports false: macOS and the BSDs have no CAP_IPC_LOCK, and no privilege
// lifts RLIMIT_MEMLOCK in their mlock as it does in Linux's, so MemlockAuto always applies
// the limit.
func hasCapIPCLock() bool { return false }

// lockMemory makes b resident and keeps it so (mlock), counted against RLIMIT_MEMLOCK.
func lockMemory(b []byte) error { return unix.Mlock(b) }

// unlockMemory undoes lockMemory.
func unlockMemory(b []byte) error { return unix.Munlock(b) }
