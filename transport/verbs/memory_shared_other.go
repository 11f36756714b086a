//go:build !linux

package verbs

import (
	"errors"
	"fmt"
	"runtime"
)

// mapShared fails off Linux, which alone has sealed memfds; Map then maps private memory.
func mapShared(n int, huge bool) ([]byte, int, error) {
	return nil, -1, fmt.Errorf("shared registered memory (sealed memfd) is Linux's, not on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

// unmapShared is never reached: mapShared maps nothing.
func unmapShared(b []byte, fd int) error { return unmapAnon(b) }
