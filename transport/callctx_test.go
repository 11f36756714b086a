package transport

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// TestCallCtxDerivedOutlivesCall: a context derived from a handler's context (as the rpc
// layer's deadline is) may run its cancel callback after the call ended; the handler's
// context must then not have been reset for another call (that panicked the process:
// "context: internal error: missing cancel error").
func TestCallCtxDerivedOutlivesCall(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for i := 0; i < 100; i++ {
		x := new(callCtx)
		_, cancel := context.WithDeadline(x, time.Now().Add(time.Hour))
		x.cancel(context.Canceled) // starts the derived context's cancel in a goroutine
		cancel()
		if x.reset() {
			t.Fatal("a context with derived contexts was reset for reuse")
		}
		runtime.Gosched()
	}
	// Without derived contexts, it is reused.
	x := new(callCtx)
	x.cancel(context.Canceled)
	if !x.reset() || x.Err() != nil {
		t.Fatal("a plain context was not readied for reuse")
	}
	gen := x.generation()
	x.reset()
	x.cancelGen(gen, context.Canceled) // stale: must not cancel the new use
	if x.Err() != nil {
		t.Fatal("a stale cancel reached the next use")
	}
	time.Sleep(10 * time.Millisecond) // let the derived cancels run: no panic
}
