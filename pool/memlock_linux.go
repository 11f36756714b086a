package pool

import (
	"syscall"
	"unsafe"
)

// memlockHint says how to raise the locked-memory limit on Linux.
const memlockHint = "raise the limit with `ulimit -l unlimited` (or a size in KiB) in the shell that starts the process, " +
	"LimitMEMLOCK=infinity in its systemd unit, a memlock line in /etc/security/limits.conf, " +
	"or `--ulimit memlock=-1` for docker; or grant the process CAP_IPC_LOCK"

// hugePagesHint says how to reserve huge pages on Linux.
const hugePagesHint = "reserve some with sysctl vm.nr_hugepages=N"

// lockCall names the system call lockMemory makes, for errors.
const lockCall = "mlock"

// limitString says what the locked-memory limit lim is.
func limitString(lim uint64) string { return rlimitString(lim) }

// lockMemory makes b resident and keeps it so (mlock), counted against RLIMIT_MEMLOCK.
func lockMemory(b []byte) error { return syscall.Mlock(b) }

// unlockMemory undoes lockMemory.
func unlockMemory(b []byte) error { return syscall.Munlock(b) }

// memlockLimit returns the soft RLIMIT_MEMLOCK in bytes.
func memlockLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(rlimitMemlock, &r); err != nil {
		return unlimited
	}
	return r.Cur
}

// capIPCLock is the capability that exempts a process from RLIMIT_MEMLOCK.
const capIPCLock = 14

// capHeader and capData are the arguments of capget(2) and capset(2), version 3.
type capHeader struct {
	version uint32
	pid     int32 // 0: the calling thread
}

type capData struct{ effective, permitted, inheritable uint32 }

// capget returns the capability sets of the calling thread (two 32-bit words each).
func capget() ([2]capData, error) {
	hdr := capHeader{version: 0x20080522} // _LINUX_CAPABILITY_VERSION_3
	var data [2]capData
	_, _, e := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if e != 0 {
		return data, e
	}
	return data, nil
}

// hasCapIPCLock reports whether the calling thread has CAP_IPC_LOCK in its effective set.
// Capabilities are per thread in Linux, and so is the kernel's check at registration.
func hasCapIPCLock() bool {
	data, err := capget()
	return err == nil && data[0].effective&(1<<capIPCLock) != 0
}
