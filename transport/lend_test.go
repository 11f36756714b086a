package transport

import (
	"bytes"
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestLentQueueCatchesUp: a request that reaches the completion queue after the batch
// whose last completion runs a handler inline was polled, but before the queue is lent
// (armed), is served while the handler runs, not after it. Armed, the queue tells only of
// completions added after; the one already there used to wait for the handler.
//
// The inline handler runs until the other connection's call is answered, or holdAtMost:
// served only after the handler, the call is answered after that hold ran out. No
// wall-clock bound on the call itself, which a loaded machine can stretch.
func TestLentQueueCatchesUp(t *testing.T) {
	const holdAtMost = 10 * time.Second
	var release atomic.Pointer[chan struct{}]
	var heldOut atomic.Bool // the slow handler's hold ran out
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		if bytes.Equal(req, []byte("slow")) {
			select {
			case <-*release.Load():
			case <-time.After(holdAtMost):
				heldOut.Store(true)
			}
		}
		_ = w.Write(StatusOK, req)
	})
	for _, fb := range fabrics[:2] { // inproc and tcp: soft devices, whose CQs can be lent
		t.Run(fb.name, func(t *testing.T) {
			done := make(chan struct{})
			release.Store(&done)
			heldOut.Store(false)
			e := newEnv(t, fb, h, Config{InlineHandlers: true})
			ctx, cancel := context.WithTimeout(context.Background(), 3*holdAtMost)
			defer cancel()
			other, err := e.client.Dial(ctx, e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			// While the server's reaper holds the slow request's completion (the last of its
			// batch), the other connection's request is sent and lands in the queue.
			sent := make(chan time.Time, 1)
			answered := make(chan error, 1)
			var once atomic.Bool
			hook := func(wc *verbs.WorkCompletion) {
				if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.ByteLen != wire.HeaderLen+uint32(len("slow")) || !once.CompareAndSwap(false, true) {
					return
				}
				go func() {
					sent <- time.Now()
					resp, err := other.Call(ctx, []byte("meanwhile"))
					if err == nil {
						resp.Release()
					}
					answered <- err
				}()
				// Time for the other request to reach the queue before it is armed, the case
				// this test is for. Should it come later, the armed queue must serve it too.
				time.Sleep(50 * time.Millisecond)
			}
			e.server.testHookWC.Store(&hook)
			defer e.server.testHookWC.Store(nil)
			slow := make(chan error, 1)
			go func() {
				resp, err := e.conn.Call(ctx, []byte("slow"))
				if err == nil {
					resp.Release()
				}
				slow <- err
			}()
			t0 := <-sent
			var err2 error
			select {
			case err2 = <-answered:
			case <-time.After(2 * time.Second):
				// Long past a call's time: where every goroutine is tells which path
				// made it wait (the test fails below if it waits for the handler).
				buf := make([]byte, 1<<20)
				t.Logf("the other connection's call is not answered after 2s; the goroutines:\n%s", buf[:runtime.Stack(buf, true)])
				err2 = <-answered
			}
			if err2 != nil {
				t.Fatal(err2)
			}
			waited := time.Since(t0)
			servedAfter := heldOut.Load()
			close(done)
			if err := <-slow; err != nil {
				t.Fatal(err)
			}
			if servedAfter {
				t.Fatalf("the other connection's call took %v, answered only after an inline handler held for %v: it waited for the handler", waited, holdAtMost)
			}
			t.Logf("the other connection's call took %v while an inline handler ran", waited)
		})
	}
}

// TestTeardownWhileLentHandlerRuns: a connection whose stream reader runs a handler inline
// with the queue lent is closed while the handler runs. The poller
// tears it down without its token: destroying the QP waits for that reader, which takes the
// token back once the handler returns. Holding the token there deadlocked both.
func TestTeardownWhileLentHandlerRuns(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		if bytes.Equal(req, []byte("slow")) {
			entered <- struct{}{}
			<-release
		}
		_ = w.Write(StatusOK, req)
	})
	e := newEnv(t, fabrics[1], h, Config{InlineHandlers: true}) // tcp: its readers reap
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := e.conn.Call(ctx, []byte("warm"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Release()
	time.Sleep(100 * time.Millisecond) // the server's poller parks: its stream reader reaps the next request
	go func() {
		if resp, err := e.conn.Call(ctx, []byte("slow")); err == nil {
			resp.Release()
		}
	}()
	<-entered
	closed := make(chan struct{})
	go func() { // the server closes its side while the handler runs
		_ = e.serverConn(t).Close()
		close(closed)
	}()
	// Time for the poller to begin the teardown, which then waits for the reader (on a
	// machine too loaded for that, the handler returns first and the case is not reached).
	time.Sleep(300 * time.Millisecond)
	close(release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection is not torn down 10s after its inline handler returned")
	}
}
