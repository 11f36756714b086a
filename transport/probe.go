package transport

// b2u is 1 for true: an aux value for the probe points (internal/probe), which cost
// nothing without the build tag mwrpcprobe.
func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
