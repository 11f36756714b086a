package main

import "syscall"

// childSysProcAttr has the kernel kill a child process (a server, a caller) when this one
// dies, even by SIGKILL.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
