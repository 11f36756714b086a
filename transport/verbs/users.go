package verbs

import (
	"fmt"
	"sync"
)

// Users counts the objects that depend on a verbs object (the MRs, MWs and QPs of a PD), so
// that releasing it while they exist fails with ErrBusy and using it after its release
// fails with ErrClosed. Providers embed it; the zero value is ready.
type Users struct {
	mu     sync.Mutex
	n      int
	closed bool
}

// Acquire counts one more dependent; what names the object in the error.
func (u *Users) Acquire(what string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return fmt.Errorf("%s: %w", what, ErrClosed)
	}
	u.n++
	return nil
}

// Release drops a dependent counted by Acquire.
func (u *Users) Release() {
	u.mu.Lock()
	u.n--
	u.mu.Unlock()
}

// Close releases the object with release (which may be nil) if nothing depends on it, and
// marks it released unless release fails. op names the call and deps what the dependents
// are, for the errors.
func (u *Users) Close(op, deps string, release func() error) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	if u.n > 0 {
		return fmt.Errorf("%s: %d %s still use it: %w", op, u.n, deps, ErrBusy)
	}
	if release != nil {
		if err := release(); err != nil {
			return err
		}
	}
	u.closed = true
	return nil
}
