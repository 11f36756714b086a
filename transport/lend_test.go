package transport

import (
	"bytes"
	"context"
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
func TestLentQueueCatchesUp(t *testing.T) {
	const slowFor = time.Second
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		if bytes.Equal(req, []byte("slow")) {
			time.Sleep(slowFor)
		}
		_ = w.Write(StatusOK, req)
	})
	for _, fb := range fabrics[:2] { // inproc and tcp: soft devices, whose CQs can be lent
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, h, Config{InlineHandlers: true})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
				time.Sleep(50 * time.Millisecond) // the other request reaches the queue
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
			if err := <-answered; err != nil {
				t.Fatal(err)
			}
			waited := time.Since(t0)
			if err := <-slow; err != nil {
				t.Fatal(err)
			}
			// Served after the handler would be slowFor (less the hook's 50 ms) or more.
			if waited >= slowFor-50*time.Millisecond {
				t.Fatalf("the other connection's call took %v while an inline handler ran %v: it waited for the handler", waited, slowFor)
			}
			t.Logf("the other connection's call took %v while an inline handler ran %v", waited, slowFor)
		})
	}
}
