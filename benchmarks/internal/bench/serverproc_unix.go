//go:build unix && !linux

package bench

import (
	"syscall"
	"time"
)

// serverSysProcAttr puts a server process in a process group of its own. Without
// Pdeathsig (Linux only) a server outlives a harness killed by SIGKILL only until it sees
// the end of its stdin.
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// killGroup kills the process group pgid.
func killGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }

// processRunQueueWait is not known here.
func processRunQueueWait(int) (time.Duration, bool) { return 0, false }

// processCPU is not known here.
func processCPU(int) (time.Duration, bool) { return 0, false }
