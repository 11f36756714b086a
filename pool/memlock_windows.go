package pool

import (
	"unsafe"

	"golang.org/x/sys/windows"
)

// memlockHint says what bounds locked memory on Windows and how to raise it.
const memlockHint = "Windows locks at most the process's minimum working set: raise it with SetProcessWorkingSetSizeEx " +
	"before the pool grows, or leave Config.Lock off (the soft provider does not need resident pages)"

// hugePagesHint says why huge pages are not used on Windows.
const hugePagesHint = "large pages need SeLockMemoryPrivilege and are not used on Windows"

// lockCall names the system call lockMemory makes, for errors.
const lockCall = "VirtualLock"

// limitString says what the locked-memory limit is: Windows has no RLIMIT_MEMLOCK.
func limitString(uint64) string {
	return "Windows has no RLIMIT_MEMLOCK (VirtualLock is bounded by the working set)"
}

// memlockLimit returns unlimited: Windows has no per-process locked-memory limit that a
// registration counts against. The soft provider pins nothing; with Config.Lock,
// VirtualLock's own working-set quota is the bound, and its refusal is a *MemlockError.
func memlockLimit() uint64 { return unlimited }

// hasCapIPCLock reports false: Windows has no CAP_IPC_LOCK. With memlockLimit unlimited,
// MemlockAuto applies no limit of the pool's own.
func hasCapIPCLock() bool { return false }

// lockMemory makes b resident and keeps it so (VirtualLock).
func lockMemory(b []byte) error {
	return windows.VirtualLock(uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
}

// unlockMemory undoes lockMemory.
func unlockMemory(b []byte) error {
	return windows.VirtualUnlock(uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
}
