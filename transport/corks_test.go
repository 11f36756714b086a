package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// corkedCalls is how many calls TestCorkedRequestNeedsNoResume makes.
const corkedCalls = 50

// TestCorkedRequestNeedsNoResume: a request held back for callers woken with it leaves even
// if none of them ever resumes (here one is counted that does not exist): its poster
// yields a few times (corkYields) and then sends it. Every call completes; over TCP every one was held back,
// elsewhere (where a write is no system call) none was.
func TestCorkedRequestNeedsNoResume(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, echo, Config{})
			if e.conn.corker == nil {
				t.Skipf("SKIPPED: the %s fabric's QP cannot defer a post", fb.name)
			}
			want := uint64(0)
			if fb.name == "tcp" {
				want = corkedCalls
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			e.conn.corks.woken.Add(1) // a woken caller that never resumes
			defer e.conn.corks.woken.Add(-1)
			before := e.client.Stats().Corked
			for i := range corkedCalls {
				req := payload(100+i, byte(i))
				resp, err := e.conn.Call(ctx, req)
				if err != nil {
					t.Fatalf("call %d with a caller pending that never resumes: %v", i, err)
				}
				if !bytes.Equal(resp.Bytes(), req) {
					t.Fatalf("call %d: echo differs", i)
				}
				resp.Release()
			}
			if got := e.client.Stats().Corked - before; got != want {
				t.Errorf("%d of %d requests held back while a woken caller was pending over %s, want %d", got, corkedCalls, fb.name, want)
			}
			if e.conn.corks.corked.Load() {
				t.Error("the QP is still corked after every call returned")
			}
		})
	}
}

// TestCorksBalance: many callers on one connection, some of whose calls end by their
// deadline before or after their response comes: every call is answered correctly or
// ends with its context's error, and once all have returned no caller is counted as
// woken and nothing is held back.
func TestCorksBalance(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, echo, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 32)
			for g := range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 100 {
						cctx, ccancel := ctx, context.CancelFunc(func() {})
						if i%7 == 3 { // some calls give up about when their response comes
							cctx, ccancel = context.WithTimeout(ctx, time.Duration(i%5)*20*time.Microsecond)
						}
						req := payload(64+g, byte(g*100+i))
						resp, err := e.conn.Call(cctx, req)
						ccancel()
						switch {
						case err != nil && cctx != ctx && errors.Is(err, context.DeadlineExceeded):
							continue
						case err != nil:
							errs <- fmt.Errorf("caller %d, call %d: %w", g, i, err)
							return
						case !bytes.Equal(resp.Bytes(), req):
							errs <- fmt.Errorf("caller %d, call %d: echo differs", g, i)
						}
						resp.Release()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if w := e.conn.corks.woken.Load(); w != 0 {
				t.Errorf("%d callers counted as woken after every call returned, want 0", w)
			}
			if e.conn.corks.corked.Load() {
				t.Error("the QP is still corked after every call returned")
			}
		})
	}
}
