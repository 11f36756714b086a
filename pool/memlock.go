package pool

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

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
	Limit  uint64 // the soft RLIMIT_MEMLOCK, in bytes, when the slab was refused
	Pinned int64  // bytes all pools of the process had registered
	Want   int64  // bytes of the slab
	Class  int    // buffer size of the class that was growing
	Err    error  // the system's refusal, or nil
}

// Error names the limit, what was asked, and the ways to raise the limit.
func (e *MemlockError) Error() string {
	lim := "unlimited"
	if e.Limit != unlimited {
		lim = fmt.Sprintf("%s (ulimit -l: %d)", sizeString(int64(e.Limit)), e.Limit/1024)
	}
	s := fmt.Sprintf("pool: cannot register a %s slab for class %s: RLIMIT_MEMLOCK is %s and the process's pools already hold %s; "+
		"raise the limit with `ulimit -l unlimited` (or a size in KiB) in the shell that starts the process, "+
		"LimitMEMLOCK=infinity in its systemd unit, a memlock line in /etc/security/limits.conf, "+
		"or `--ulimit memlock=-1` for docker; or grant the process CAP_IPC_LOCK",
		sizeString(e.Want), sizeString(int64(e.Class)), lim, sizeString(e.Pinned))
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

// memlockLimit returns the soft RLIMIT_MEMLOCK in bytes.
func memlockLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(rlimitMemlock, &r); err != nil {
		return unlimited
	}
	return r.Cur
}

// capIPCLock is the capability that exempts a process from RLIMIT_MEMLOCK.
const capIPCLock = 14

// capHeader and capData are the arguments of capget(2) and capset(2), version 3.
type capHeader struct {
	version uint32
	pid     int32 // 0: the calling thread
}

type capData struct{ effective, permitted, inheritable uint32 }

// capget returns the capability sets of the calling thread (two 32-bit words each).
func capget() ([2]capData, error) {
	hdr := capHeader{version: 0x20080522} // _LINUX_CAPABILITY_VERSION_3
	var data [2]capData
	_, _, e := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0)
	if e != 0 {
		return data, e
	}
	return data, nil
}

// hasCapIPCLock reports whether the calling thread has CAP_IPC_LOCK in its effective set.
// Capabilities are per thread in Linux, and so is the kernel's check at registration.
func hasCapIPCLock() bool {
	data, err := capget()
	return err == nil && data[0].effective&(1<<capIPCLock) != 0
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
