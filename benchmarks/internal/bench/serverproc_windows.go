package bench

import (
	"os"
	"syscall"

	"golang.org/x/sys/windows"
)

// serverSysProcAttr starts a server process in a process group of its own, so that a
// Ctrl+C at the console reaches the harness alone. Windows has no Pdeathsig: a server
// outlives a harness that is killed only until it sees the end of its stdin.
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: windows.CREATE_NEW_PROCESS_GROUP}
}

// killGroup terminates the server process pid (TerminateProcess). A server starts no
// processes of its own, so the process is the whole group.
func killGroup(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
