package pool

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// setMemlockLimit sets this process's soft and hard RLIMIT_MEMLOCK to n bytes.
func setMemlockLimit(n uint64) error {
	lim := syscall.Rlimit{Cur: n, Max: n}
	return syscall.Setrlimit(rlimitMemlock, &lim)
}

// dropCapIPCLock removes CAP_IPC_LOCK from the calling thread's effective set.
func dropCapIPCLock() error {
	data, err := capget()
	if err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].effective &^= 1 << capIPCLock
	hdr := capHeader{version: 0x20080522}
	if _, _, e := syscall.RawSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	if hasCapIPCLock() {
		return errors.New("CAP_IPC_LOCK still effective after capset")
	}
	return nil
}
