package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// serverSysProcAttr puts a server process in a process group of its own and has the
// kernel kill it when the harness dies (even by SIGKILL).
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process group pgid.
func killGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }

// processCPU reads the user and system time of process pid from /proc/PID/stat (fields 14
// and 15, in USER_HZ ticks: 100 a second on every Linux architecture).
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold spaces and parentheses
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * (time.Second / 100), true
}

// processRunQueueWait returns how long the threads of process pid have waited on a CPU's
// run queue so far, runnable but not running (/proc/PID/task/*/schedstat, second field,
// in ns; summed over the threads alive now, so a thread that exited takes its share
// along). It tells a stall the machine caused (the processes could not get a CPU) from
// one the system under test caused (they waited for an event). False where the kernel
// keeps no schedstat (CONFIG_SCHED_INFO off) or the process is gone.
func processRunQueueWait(pid int) (time.Duration, bool) {
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		w, ok := parseSchedstat(b)
		if !ok {
			return 0, false
		}
		sum += w
	}
	return sum, true
}
