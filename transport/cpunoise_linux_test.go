package transport

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpuSample is the machine's busy CPU time and this process's, at one instant.
type cpuSample struct {
	at           time.Time
	machine, own time.Duration // user, nice and system time of all CPUs; of this process
}

// clockTick is USER_HZ, the unit of /proc's CPU times: 100 on every Linux ABI Go runs on.
const clockTick = 100

// sampleCPU reads /proc/stat and /proc/self/stat; ok is false where they cannot be read.
func sampleCPU() (s cpuSample, ok bool) {
	s.at = time.Now()
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, false
	}
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line)) // cpu user nice system idle ...
	if len(f) < 4 || f[0] != "cpu" {
		return s, false
	}
	var busy int64
	for _, v := range f[1:4] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s, false
		}
		busy += n
	}
	self, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return s, false
	}
	// The command name may hold spaces: the fields that follow it start after its ')'.
	i := bytes.LastIndexByte(self, ')')
	g := strings.Fields(string(self[i+1:])) // state ppid ... utime(12th) stime(13th)
	if i < 0 || len(g) < 13 {
		return s, false
	}
	ut, err1 := strconv.ParseInt(g[11], 10, 64)
	st, err2 := strconv.ParseInt(g[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, false
	}
	s.machine = time.Duration(busy) * time.Second / clockTick
	s.own = time.Duration(ut+st) * time.Second / clockTick
	return s, true
}

// othersCores is how many cores, on average, other processes kept busy between a and b.
func othersCores(a, b cpuSample) float64 {
	wall := b.at.Sub(a.at)
	if wall <= 0 {
		return 0
	}
	return float64((b.machine-a.machine)-(b.own-a.own)) / float64(wall)
}

// TestSampleCPU: CPU time this process spins shows as its own, and in the machine's busy
// time, which includes it, so it is not counted as another process's.
func TestSampleCPU(t *testing.T) {
	a, ok := sampleCPU()
	if !ok {
		t.Fatal("/proc/stat or /proc/self/stat could not be parsed")
	}
	b := a
	for deadline := time.Now().Add(20 * time.Second); b.own-a.own < 200*time.Millisecond; b, _ = sampleCPU() {
		if time.Now().After(deadline) {
			t.Fatalf("this process's CPU time grew %v in 20 s of spinning: /proc/self/stat is not read right", b.own-a.own)
		}
		for end := time.Now().Add(10 * time.Millisecond); time.Now().Before(end); {
		}
	}
	// (Both count in ticks of 10 ms, sampled apart: a few ticks of slack.)
	if machine := b.machine - a.machine; machine+30*time.Millisecond < b.own-a.own {
		t.Fatalf("this process's CPU time grew %v, the machine's busy time only %v", b.own-a.own, machine)
	}
	t.Logf("spun %v of CPU time: machine busy %v, others %.2f cores", b.own-a.own, b.machine-a.machine, othersCores(a, b))
}
