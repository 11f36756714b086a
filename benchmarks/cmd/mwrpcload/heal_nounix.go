//go:build !unix

package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
)

// notifyHeal delivers nothing: there is no SIGUSR1 to send a process here, and faults,
// the only sender, runs on Linux alone. A caller's summary then has no recovery time.
func notifyHeal(chan<- os.Signal) {}

// sendHeal fails: a process cannot be sent SIGUSR1 here.
func sendHeal(*os.Process) error {
	return fmt.Errorf("signalling a heal (SIGUSR1) is not on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}
