//go:build !linux

package main

import "syscall"

// childSysProcAttr is nil: Pdeathsig is Linux's. Here a child process that this one
// started outlives it when it is killed; soak and faults kill their children on every
// path that returns.
func childSysProcAttr() *syscall.SysProcAttr { return nil }
