package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
)

// The heal notice: faults tells a caller that a fault has healed by writing healLine to
// the caller's stdin, a pipe it keeps open while the caller runs. A line on a pipe cannot
// be lost or coalesced, and needs nothing of the operating system but the pipe (a signal
// here went missing now and then, which read as a service that never recovered).
const healLine = "heal"

// callerProc is a caller process started by faults, with the pipe to its stdin.
type callerProc struct {
	*exec.Cmd
	stdin io.WriteCloser
}

// sendHeal tells the caller that the fault has healed.
func sendHeal(cl *callerProc) error {
	if _, err := io.WriteString(cl.stdin, healLine+"\n"); err != nil {
		return fmt.Errorf("telling the caller of the heal: %w", err)
	}
	return nil
}

// watchHeal reads stdin for the heal notice, and sends on c when it comes (once). It ends
// at stdin's end; run by hand with a terminal for stdin, it waits there for the process.
func watchHeal(c chan<- struct{}) {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == healLine {
			c <- struct{}{}
			return
		}
	}
}
