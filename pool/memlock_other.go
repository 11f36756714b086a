//go:build !linux && !windows && !darwin && !dragonfly && !freebsd && !netbsd && !openbsd

package pool

import (
	"errors"
	"fmt"
	"runtime"
)

// memlockHint says that this OS has no locked-memory limit the pool knows of.
const memlockHint = "the pool knows no locked-memory limit on this OS; leave Config.Lock off"

// hugePagesHint says why huge pages are not used here.
const hugePagesHint = "huge pages (MAP_HUGETLB) are Linux's"

// lockCall names what lockMemory would do, for errors.
const lockCall = "lock"

// limitString says that no limit is known.
func limitString(uint64) string { return "no locked-memory limit is known on " + runtime.GOOS }

// memlockLimit returns unlimited: no limit the pool could read.
func memlockLimit() uint64 { return unlimited }

// hasCapIPCLock reports false: CAP_IPC_LOCK is Linux's.
func hasCapIPCLock() bool { return false }

// lockMemory fails: Config.Lock is not on this OS.
func lockMemory([]byte) error {
	return fmt.Errorf("locking memory is not on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

// unlockMemory is never reached: lockMemory locks nothing.
func unlockMemory([]byte) error { return nil }
