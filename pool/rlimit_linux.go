//go:build !(mips || mipsle || mips64 || mips64le)

package pool

// rlimitMemlock is RLIMIT_MEMLOCK, which package syscall does not define.
const rlimitMemlock = 8
