//go:build !unix && !windows

package verbs

import (
	"errors"
	"fmt"
	"runtime"
)

// mapCall names the system call that maps Memory, for Map's errors.
const mapCall = "map"

// mapAnon fails: this OS (js, wasip1, plan9) offers no memory outside the Go heap that a
// provider could register.
func mapAnon(n int, huge bool) ([]byte, error) {
	return nil, fmt.Errorf("registered memory is not on %s (Linux, macOS, Windows and the BSDs have it): %w", runtime.GOOS, errors.ErrUnsupported)
}

// unmapAnon is never reached: mapAnon maps nothing.
func unmapAnon(b []byte) error {
	return fmt.Errorf("unmap: not on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}
