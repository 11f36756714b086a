//go:build !linux

package soft

import (
	"errors"
	"fmt"
	"runtime"
)

// directWrites reports whether a poster writes a large frame of up to tryTxMax bytes
// itself with a writev that never waits (tcpLink.sendNow). Not on this OS (a portable
// writev without an allocation per call is not at hand here): such frames are the
// engine's, as they were everywhere before.
const directWrites = false

// iovecs is unused here.
type iovecs struct{}

var errNoDirectWrites = fmt.Errorf("soft: a writev that never waits is not used on %s: %w", runtime.GOOS, errors.ErrUnsupported)

// tryWritev is never reached here (directWrites is false).
func (l *tcpLink) tryWritev(uintptr) bool {
	l.tryN, l.tryErr = 0, errNoDirectWrites
	return true
}
