//go:build unix

package bench

import (
	"syscall"
	"time"
)

// selfCPU returns the user and system time this process has used (getrusage).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
