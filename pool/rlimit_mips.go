//go:build linux && (mips || mipsle || mips64 || mips64le)

package pool

// rlimitMemlock is RLIMIT_MEMLOCK, which package syscall does not define (MIPS numbering).
const rlimitMemlock = 9
