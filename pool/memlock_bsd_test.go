//go:build darwin || dragonfly || freebsd || netbsd || openbsd

package pool

import "golang.org/x/sys/unix"

// setMemlockLimit sets this process's soft and hard RLIMIT_MEMLOCK to n bytes.
func setMemlockLimit(n uint64) error {
	var lim unix.Rlimit
	setRlim(&lim.Cur, n)
	setRlim(&lim.Max, n)
	return unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim)
}

// setRlim stores n in an rlimit field, an int64 on FreeBSD and DragonFly, a uint64
// elsewhere.
func setRlim[T int64 | uint64](f *T, n uint64) { *f = T(n) }

// dropCapIPCLock has nothing to drop: no capability lifts RLIMIT_MEMLOCK here.
func dropCapIPCLock() error { return nil }
