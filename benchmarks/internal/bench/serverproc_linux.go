package bench

import "syscall"

// serverSysProcAttr puts a server process in a process group of its own and has the
// kernel kill it when the harness dies (even by SIGKILL).
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process group pgid.
func killGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
