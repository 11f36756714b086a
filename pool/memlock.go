package pool

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// ErrMemlock is the cause of a failure to register memory because of the locked-memory
// limit (RLIMIT_MEMLOCK). The *MemlockError that carries it says how to raise the limit.
var ErrMemlock = errors.New("locked-memory limit (RLIMIT_MEMLOCK) reached")

// pinned counts the bytes registered by every Pool of the process. The kernel counts an
// ibv_reg_mr against RLIMIT_MEMLOCK per process (not per pool), and so do the pools.
var pinned atomic.Int64

// unlimited is RLIM_INFINITY.
const unlimited = ^uint64(0)

// MemlockError reports a slab that could not be registered because of RLIMIT_MEMLOCK: the
// pool's own check refused it (Err is nil), or mmap, mlock or the provider failed with
// ENOMEM/EAGAIN (Err is that failure). It matches ErrMemlock and verbs.ErrNoMemory.
type MemlockError struct {
	Limit  uint64 // the soft RLIMIT_MEMLOCK, in bytes, when the slab was refused (Windows: unlimited)
	Pinned int64  // bytes all pools of the process had registered
	Want   int64  // bytes of the slab
	Class  int    // buffer size of the class that was growing
	Err    error  // the system's refusal, or nil
}

// Error names the limit, what was asked, and the ways to raise the limit.
func (e *MemlockError) Error() string {
	s := fmt.Sprintf("pool: cannot register a %s slab for class %s: %s and the process's pools already hold %s; %s",
		sizeString(e.Want), sizeString(int64(e.Class)), limitString(e.Limit), sizeString(e.Pinned), memlockHint)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrMemlock, verbs.ErrNoMemory and the system's error, if any.
func (e *MemlockError) Unwrap() []error {
	errs := []error{ErrMemlock, verbs.ErrNoMemory}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// memlockEnforced reports whether the pool's policy applies the limit lim now.
func (p *Pool) memlockEnforced(lim uint64) bool {
	switch {
	case p.cfg.Memlock == MemlockIgnore || lim == unlimited:
		return false
	case p.cfg.Memlock == MemlockEnforce:
		return true
	}
	return !hasCapIPCLock()
}

// reservePinned counts want more bytes against the process's registered total, refusing
// with a *MemlockError if that would exceed RLIMIT_MEMLOCK under the pool's policy. It
// returns the limit it read.
func (p *Pool) reservePinned(c *class, want int64) (uint64, error) {
	lim := memlockLimit()
	enforce := p.memlockEnforced(lim)
	for {
		cur := pinned.Load()
		if enforce && uint64(cur+want) > lim {
			return lim, &MemlockError{Limit: lim, Pinned: cur, Want: want, Class: c.size}
		}
		if pinned.CompareAndSwap(cur, cur+want) {
			return lim, nil
		}
	}
}

// memlockError wraps a system failure to map, lock or register memory.
func (p *Pool) memlockError(c *class, lim uint64, err error) error {
	return &MemlockError{Limit: lim, Pinned: pinned.Load() - int64(c.mapBytes), Want: int64(c.mapBytes), Class: c.size, Err: err}
}

// warnMemlock logs, at New, when the pool's cap is beyond what RLIMIT_MEMLOCK lets the
// process register.
func (p *Pool) warnMemlock() {
	lim := memlockLimit()
	if !p.memlockEnforced(lim) || uint64(p.cfg.MaxBytes) <= lim {
		return
	}
	p.cfg.Logger.Warn("pool: MaxBytes exceeds RLIMIT_MEMLOCK; growth past the limit will fail (raise it with `ulimit -l unlimited` or LimitMEMLOCK=infinity)",
		"max_bytes", sizeString(p.cfg.MaxBytes), "memlock", sizeString(int64(lim)))
}
