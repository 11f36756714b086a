//go:build !mwrpcprobe

package probe

// Enabled reports whether the probe is compiled in (build tag mwrpcprobe).
const Enabled = false

// Mark records step now; without the build tag mwrpcprobe it does nothing.
func Mark(Step) {}

// MarkN records step with aux now; without the build tag mwrpcprobe it does nothing.
func MarkN(Step, uint32) {}

// Reset forgets what was recorded.
func Reset() {}

// Records returns what was recorded, oldest first, and how many marks the ring lost.
func Records() ([]Record, uint64) { return nil, 0 }
