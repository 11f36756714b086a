package transport

import "golang.org/x/sys/windows"

// lowerPriority gives this process the lowest priority class (IDLE_PRIORITY_CLASS, what
// nice 19 is on Unix), so that an attacker process does not take the cores from the
// server it attacks.
func lowerPriority() {
	_ = windows.SetPriorityClass(windows.CurrentProcess(), windows.IDLE_PRIORITY_CLASS)
}
