//go:build mwrpcprobe

package probe

import (
	"sync/atomic"
	_ "unsafe" // go:linkname
)

// Enabled reports whether the probe is compiled in (build tag mwrpcprobe).
const Enabled = true

// ringLen records are kept (16 bytes each, 64 MiB of untouched BSS until used): the
// newest win.
const ringLen = 1 << 22

var (
	ring [ringLen]Record
	next atomic.Uint64
)

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Mark records step now.
func Mark(s Step) { MarkN(s, 0) }

// MarkN records step with aux now: CLOCK_MONOTONIC through the vDSO, about 20 ns.
func MarkN(s Step, aux uint32) {
	i := next.Add(1) - 1
	r := &ring[i&(ringLen-1)]
	r.T, r.Step, r.Aux = nanotime(), s, aux
}

// Reset forgets what was recorded. Nothing may mark meanwhile.
func Reset() { next.Store(0) }

// Records returns what was recorded, in the order of their slots (marks made at once on
// several goroutines may be out of time order by a few ns), and how many the ring lost.
func Records() ([]Record, uint64) {
	n := next.Load()
	if n <= ringLen {
		return append([]Record(nil), ring[:n]...), 0
	}
	out := make([]Record, 0, ringLen)
	start := n & (ringLen - 1)
	out = append(out, ring[start:]...)
	out = append(out, ring[:start]...)
	return out, n - ringLen
}
