//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"
)

// notifyHeal delivers to c the signal with which faults tells a caller that a fault has
// healed (SIGUSR1).
func notifyHeal(c chan<- os.Signal) { signal.Notify(c, syscall.SIGUSR1) }

// sendHeal tells the caller process p that the fault has healed.
func sendHeal(p *os.Process) error { return p.Signal(syscall.SIGUSR1) }
