//go:build !linux

package transport

import "time"

// cpuSample is the machine's busy CPU time and this process's, at one instant.
type cpuSample struct {
	at           time.Time
	machine, own time.Duration
}

// sampleCPU cannot tell other processes' CPU time here: ok is false.
func sampleCPU() (cpuSample, bool) { return cpuSample{at: time.Now()}, false }

// othersCores is how many cores, on average, other processes kept busy between a and b.
func othersCores(a, b cpuSample) float64 { return 0 }
