//go:build !linux

package bench

import (
	"errors"
	"runtime"
)

// PinCPUs fails: pinning threads to CPUs (sched_setaffinity) is Linux's.
func PinCPUs(cpus []int) error {
	return errors.New("-cpus needs Linux (sched_setaffinity); on " + runtime.GOOS + " run without it")
}
