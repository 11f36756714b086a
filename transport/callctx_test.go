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

// TestCallDeadline: WithCallDeadline arms a handler's own context with the caller's
// deadline, which it reports and ends at (context.DeadlineExceeded); a reused context
// starts without one, and the timer of an earlier use does not end a later use before its
// own deadline; another context gets a context.WithDeadline; contexts derived from a
// handler's context end with the call.
func TestCallDeadline(t *testing.T) {
	t.Run("ends at the deadline", func(t *testing.T) {
		x := new(callCtx)
		d := time.Now().Add(20 * time.Millisecond)
		ctx, cancel := WithCallDeadline(x, d)
		if ctx != context.Context(x) || cancel != nil {
			t.Fatalf("WithCallDeadline on a handler's context returned %T, cancel %v; want the context itself", ctx, cancel != nil)
		}
		if got, ok := x.Deadline(); !ok || !got.Equal(d) {
			t.Fatalf("Deadline() = %v, %v; want %v", got, ok, d)
		}
		select {
		case <-x.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("not done 5 s after a 20 ms deadline")
		}
		if time.Now().Before(d) || x.Err() != context.DeadlineExceeded {
			t.Fatalf("done at %v (deadline %v), Err %v; want DeadlineExceeded at the deadline", time.Now(), d, x.Err())
		}
		if !x.reset() {
			t.Fatal("a context with no derived contexts was not readied for reuse")
		}
		if _, ok := x.Deadline(); ok || x.Err() != nil {
			t.Fatal("a reused context kept the last call's deadline or error")
		}
	})
	t.Run("a past deadline ends it at once", func(t *testing.T) {
		x := new(callCtx)
		WithCallDeadline(x, time.Now().Add(-time.Second))
		if x.Err() != context.DeadlineExceeded {
			t.Fatalf("Err %v, want DeadlineExceeded", x.Err())
		}
	})
	t.Run("an earlier use's timer", func(t *testing.T) {
		x := new(callCtx)
		WithCallDeadline(x, time.Now().Add(time.Millisecond))
		time.Sleep(5 * time.Millisecond) // it fired (or is about to)
		x.reset()
		WithCallDeadline(x, time.Now().Add(time.Hour))
		time.Sleep(20 * time.Millisecond)
		if x.Err() != nil {
			t.Fatalf("the next use ended (%v) an hour before its deadline", x.Err())
		}
		x.reset()
	})
	t.Run("other contexts", func(t *testing.T) {
		parent, stop := context.WithCancel(context.Background())
		defer stop()
		d := time.Now().Add(time.Hour)
		ctx, cancel := WithCallDeadline(parent, d)
		if cancel == nil || ctx == parent {
			t.Fatal("WithCallDeadline on another context did not derive one")
		}
		defer cancel()
		if got, ok := ctx.Deadline(); !ok || !got.Equal(d) {
			t.Fatalf("Deadline() = %v, %v; want %v", got, ok, d)
		}
	})
	t.Run("derived contexts end with the call", func(t *testing.T) {
		x := new(callCtx)
		WithCallDeadline(x, time.Now().Add(time.Hour))
		child, cancel := context.WithCancel(x)
		defer cancel()
		if x.reset() {
			t.Fatal("a context with derived contexts was readied for reuse")
		}
		select {
		case <-child.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a context derived from the handler's did not end with the call")
		}
	})
}
