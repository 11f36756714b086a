package bench

import (
	"strconv"
	"strings"
	"time"
)

// parseSchedstat reads the run-queue wait from the text of a /proc schedstat file: three
// numbers, time on a CPU (ns), time waiting on a run queue (ns), time slices run.
func parseSchedstat(b []byte) (time.Duration, bool) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, false
	}
	w, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || w < 0 {
		return 0, false
	}
	return time.Duration(w), true
}

// A process of a row is starved when its threads, together, waited on a run queue at least
// starvedWait per second of the round and starvedRatio times as long as they ran: its
// latency and throughput are then the machine's as much as the system's. Waiting alone
// says little on 2 cores: the harness and a server, each with GOMAXPROCS threads, wait for
// each other about as long as they run (1-2 s a second, measured, with nothing else
// running); under other load that wants the CPUs they wait 30-40 times as long.
const (
	starvedWait  = 100 * time.Millisecond
	starvedRatio = 10
)

// starved reports whether a process that waited wait and ran cpu, both in ms per second
// of the round, was starved.
func starved(wait, cpu float64) bool {
	return wait >= float64(starvedWait.Milliseconds()) && wait >= starvedRatio*cpu
}
