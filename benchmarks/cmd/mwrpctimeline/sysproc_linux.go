package main

import "syscall"

// sysProcAttr has the kernel kill a server process when this one dies.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
