//go:build !linux && !darwin && !dragonfly && !freebsd && !netbsd && !openbsd

package pool

import (
	"errors"
	"fmt"
	"runtime"
)

// setMemlockLimit fails: this OS has no RLIMIT_MEMLOCK (TestMemlock skips here).
func setMemlockLimit(uint64) error {
	return fmt.Errorf("RLIMIT_MEMLOCK is not on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

// dropCapIPCLock has nothing to drop: CAP_IPC_LOCK is Linux's.
func dropCapIPCLock() error { return nil }
