// Package leakcheck fails a test that leaves goroutines behind, or descriptors and memfd
// mappings (Held). It is for this module's tests (and Held for its load harness): every
// package that starts goroutines runs its tests through Main (in its TestMain), and a test
// that must prove it stops its own goroutines calls Check.
package leakcheck

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Check records how many goroutines run now and, at the test's cleanup, fails it if more
// still run after 5 s. Call it first in a test, so that its check runs after every other
// cleanup.
func Check(t testing.TB) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() { Wait(t, base) })
}

// Wait fails t, with every goroutine's stack, if more than base goroutines still run
// after 5 s.
func Wait(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Errorf("%d goroutines leaked:\n%s", runtime.NumGoroutine()-base, stacks())
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Main runs m's tests and then fails the test binary, with every goroutine's stack, if
// more goroutines run than before the tests once 10 s have passed: a goroutine some test
// started and never stopped. Use it as a package's TestMain: os.Exit(leakcheck.Main(m)).
// It returns the exit code.
func Main(m *testing.M) int { return MainIgnoring(m) }

// MainIgnoring is Main for a package whose tests run other projects' code in process,
// such as the benchmark harness's peers: goroutines created by a function whose name
// starts with one of the prefixes (for example "github.com/cloudwego/") are not counted.
// Those libraries keep process-wide workers that nothing can stop; the project's own
// goroutines are still counted.
func MainIgnoring(m *testing.M, creators ...string) int {
	base := count(creators)
	code := m.Run()
	if code != 0 || fuzzing() {
		return code
	}
	deadline := time.Now().Add(10 * time.Second)
	for count(creators) > base {
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutines still run after the tests (%d before them):\n%s\nFAIL\n",
				count(creators)-base, base, stacks())
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
	return code
}

// count is the number of goroutines, less those created by a function named with one of
// the prefixes.
func count(creators []string) int {
	if len(creators) == 0 {
		return runtime.NumGoroutine()
	}
	n := 0
	for _, g := range strings.Split(stacks(), "\n\n") {
		if !createdBy(g, creators) {
			n++
		}
	}
	return n
}

// createdBy reports whether the goroutine whose stack is g was created by a function
// named with one of the prefixes.
func createdBy(g string, creators []string) bool {
	_, after, ok := strings.Cut(g, "\ncreated by ")
	if !ok {
		return false
	}
	for _, c := range creators {
		if strings.HasPrefix(after, c) {
			return true
		}
	}
	return false
}

// stacks is every goroutine's stack, as runtime.Stack writes them: one block each,
// separated by a blank line.
func stacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// fuzzing reports whether the binary ran a fuzz target (-test.fuzz): the fuzzing engine
// keeps goroutines of its own (signal handling, its workers' pipes, and those the seed
// corpus's first run left to the package's pools), so the count means nothing then; the
// check is for tests.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}
