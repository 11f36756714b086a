package transport

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestHeldResponses: callers that keep their Responses while others call (a batch read
// where it landed, rpc.WithLentResponses) must not stall the connection. A Response in a
// receive slot holds the slot, and the slot's credit comes back only once it is reposted;
// when the callers held every credit, the server could send no response at all, and none
// of them would ever release: the connection failed after CreditTimeout. Four times
// Credits callers each hold their response until all of them have one.
func TestHeldResponses(t *testing.T) {
	const credits = 8
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) { _ = w.Write(StatusOK, req) })
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			cfg := Config{Credits: credits, CreditTimeout: 2 * time.Second}
			e := newEnv(t, fb, h, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			const callers = 4 * credits
			var all, got sync.WaitGroup
			all.Add(callers)
			got.Add(callers)
			errs := make(chan error, callers)
			for i := range callers {
				go func() {
					defer all.Done()
					req := []byte(fmt.Sprintf("call %d", i))
					resp, err := e.conn.Call(ctx, req)
					got.Done()
					if err != nil {
						errs <- err
						return
					}
					got.Wait() // every caller holds its response until all have theirs
					if !bytes.Equal(resp.Bytes(), req) {
						errs <- fmt.Errorf("call %d: response %q", i, resp.Bytes())
					}
					resp.Release()
				}()
			}
			all.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if st := e.server.Stats(); st.Stalled != 0 {
				t.Errorf("server: %d connections stalled for credits, want 0", st.Stalled)
			}
			// At most half the credits stay held in slots: the rest were copied out.
			if n := e.client.Stats().Unshared; n < callers-credits/2 {
				t.Errorf("client: %d responses copied out of their slots, want at least %d", n, callers-credits/2)
			}
			if n := e.conn.out.heldResp.Load(); n != 0 {
				t.Errorf("client: %d responses counted as held after every Release, want 0", n)
			}
		})
	}
}
