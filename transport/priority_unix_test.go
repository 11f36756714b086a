//go:build unix

package transport

import "syscall"

// lowerPriority gives this process the lowest scheduling priority (nice 19), so that an
// attacker process does not take the cores from the server it attacks.
func lowerPriority() { _ = syscall.Setpriority(syscall.PRIO_PROCESS, 0, 19) }
