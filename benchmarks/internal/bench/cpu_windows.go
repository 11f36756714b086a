package bench

import (
	"time"

	"golang.org/x/sys/windows"
)

// selfCPU returns the user and kernel time this process has used (GetProcessTimes).
func selfCPU() time.Duration {
	d, _ := processTimes(windows.CurrentProcess())
	return d
}

// processRunQueueWait is not known on Windows.
func processRunQueueWait(int) (time.Duration, bool) { return 0, false }

// processCPU returns the user and kernel time of process pid (GetProcessTimes).
func processCPU(pid int) (time.Duration, bool) {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return 0, false
	}
	defer windows.CloseHandle(h)
	return processTimes(h)
}

// processTimes adds the user and kernel times of process h, which Windows counts in
// 100 ns units.
func processTimes(h windows.Handle) (time.Duration, bool) {
	var creation, exit, kernel, user windows.Filetime
	if err := windows.GetProcessTimes(h, &creation, &exit, &kernel, &user); err != nil {
		return 0, false
	}
	ticks := func(f windows.Filetime) int64 { return int64(f.HighDateTime)<<32 | int64(f.LowDateTime) }
	return time.Duration(ticks(kernel)+ticks(user)) * 100, true
}
