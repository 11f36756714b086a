// Package leakcheck fails a test that leaves goroutines behind. It is for this module's
// tests only.
package leakcheck

import (
	"runtime"
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
			buf := make([]byte, 1<<20)
			t.Errorf("%d goroutines leaked:\n%s", runtime.NumGoroutine()-base, buf[:runtime.Stack(buf, true)])
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
