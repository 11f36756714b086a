//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package pool

import "fmt"

// rlimitString says what the soft RLIMIT_MEMLOCK lim is, in bytes and as `ulimit -l` shows
// it, for the OSes that have one.
func rlimitString(lim uint64) string {
	if lim == unlimited {
		return "RLIMIT_MEMLOCK is unlimited"
	}
	return fmt.Sprintf("RLIMIT_MEMLOCK is %s (ulimit -l: %d)", sizeString(int64(lim)), lim/1024)
}
