package pool

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// memlockHelperEnv names the mode TestHelperMemlock runs in, in a child process.
const memlockHelperEnv = "MWRPC_POOL_MEMLOCK_HELPER"

// TestMemlock runs TestHelperMemlock in a child process whose RLIMIT_MEMLOCK is 64 KiB
// and checks that registering a 1 MiB slab fails, in each mode, with a message that names
// the limit and how to raise it.
func TestMemlock(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("Windows has no RLIMIT_MEMLOCK to lower: the pool's own check never refuses there, and VirtualLock's working-set quota is not lowered by this test")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMemlock$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), memlockHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	results := map[string]string{} // mode -> error line
	for _, line := range strings.Split(string(out), "\n") {
		if mode, msg, ok := strings.Cut(line, " error: "); ok && strings.HasPrefix(mode, "mode=") {
			results[strings.TrimPrefix(mode, "mode=")] = msg
		}
	}
	common := []string{"RLIMIT_MEMLOCK is 64 KiB (ulimit -l: 64)", "ulimit -l unlimited", memlockHint,
		"1 MiB slab for class 4 KiB", "[ErrMemlock]"}
	// Linux's mlock refuses with ENOMEM; macOS and the BSDs may say EAGAIN.
	mlockErr := "mlock: "
	if runtime.GOOS == "linux" {
		mlockErr = "mlock: cannot allocate memory"
	}
	tests := []struct {
		mode string
		want []string
	}{
		// The pool's own check, as configured for an unprivileged deployment.
		{"enforce", nil},
		// The default policy on a thread without CAP_IPC_LOCK, as the kernel decides.
		{"auto", nil},
		// Config.Lock: the kernel's mlock refuses (the pool's own check is off).
		{"mlock", []string{mlockErr}},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			msg, ok := results[tt.mode]
			if !ok {
				if strings.Contains(string(out), "mode="+tt.mode+" skip") {
					t.Skipf("helper skipped:\n%s", out)
				}
				t.Fatalf("helper printed no error for mode %s:\n%s", tt.mode, out)
			}
			for _, w := range append(common, tt.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("%s does not mention %q", msg, w)
				}
			}
		})
	}
}

// TestHelperMemlock is TestMemlock's child: it lowers RLIMIT_MEMLOCK and prints the error
// of a New that preallocates a 1 MiB slab, first with MemlockEnforce, then (CAP_IPC_LOCK
// dropped from its thread) with MemlockAuto, then with Config.Lock.
func TestHelperMemlock(t *testing.T) {
	if os.Getenv(memlockHelperEnv) == "" {
		t.Skip("run by TestMemlock in a child process")
	}
	runtime.LockOSThread() // capabilities are per thread: New must run on this one
	if err := setMemlockLimit(64 << 10); err != nil {
		t.Fatalf("setrlimit: %v", err)
	}
	try := func(mode string, cfg Config) {
		cfg.Classes, cfg.SlabSize, cfg.Prealloc = []int{4096}, 1<<20, 1
		p, err := New(newFakePD(), cfg)
		if err == nil {
			p.Close()
			t.Errorf("mode %s: New registered 1 MiB under a 64 KiB RLIMIT_MEMLOCK", mode)
			return
		}
		tag := ""
		if errors.Is(err, ErrMemlock) {
			tag = " [ErrMemlock]"
		}
		fmt.Printf("mode=%s error: %v%s\n", mode, err, tag)
	}
	try("enforce", Config{Memlock: MemlockEnforce})
	if err := dropCapIPCLock(); err != nil {
		fmt.Printf("mode=auto skip: %v\nmode=mlock skip: %v\n", err, err)
		return
	}
	try("auto", Config{})
	try("mlock", Config{Lock: true, Memlock: MemlockIgnore})
}

func TestMemlockNotEnforcedWithCapability(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CAP_IPC_LOCK is Linux's: no capability lifts the locked-memory limit on " + runtime.GOOS)
	}
	if !hasCapIPCLock() {
		t.Skip("this process lacks CAP_IPC_LOCK")
	}
	p := &Pool{cfg: Config{Memlock: MemlockAuto}}
	if p.memlockEnforced(64 << 10) {
		t.Error("MemlockAuto enforces the limit although the thread has CAP_IPC_LOCK (as the kernel would not)")
	}
	p.cfg.Memlock = MemlockEnforce
	if !p.memlockEnforced(64 << 10) {
		t.Error("MemlockEnforce does not enforce")
	}
	p.cfg.Memlock = MemlockIgnore
	if p.memlockEnforced(64 << 10) {
		t.Error("MemlockIgnore enforces")
	}
	p.cfg.Memlock = MemlockEnforce
	if p.memlockEnforced(unlimited) {
		t.Error("an unlimited RLIMIT_MEMLOCK is enforced")
	}
}
