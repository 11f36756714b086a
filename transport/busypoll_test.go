package transport

import (
	"context"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/idle"
)

// TestBusyPollCalls: a caller whose process is quiet polls for the response to a small
// call and gets it that way (Stats.Polled); never with BusyPoll off (zero, the default,
// or negative), nor while the process is busy, nor for a large call.
func TestBusyPollCalls(t *testing.T) {
	for _, fb := range fabrics {
		for _, tc := range []struct {
			name       string
			quiet      bool
			busyPoll   time.Duration // long enough for a call on a loaded 2-core machine
			size       int
			wantPolled bool
		}{
			{"quiet, small calls", true, 20 * time.Millisecond, 64, true},
			{"busy polling off by default", true, 0, 64, false},
			{"busy polling off", true, -1, 64, false},
			{"process busy", false, 20 * time.Millisecond, 64, false},
			{"large calls", true, 20 * time.Millisecond, 8 << 10, false},
		} {
			t.Run(fb.name+"/"+tc.name, func(t *testing.T) {
				defer idle.ForceQuiet(tc.quiet)()
				e := newEnv(t, fb, echo, Config{BusyPoll: tc.busyPoll})
				req := payload(tc.size, 1)
				for range 100 {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					resp, err := e.conn.Call(ctx, req)
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					resp.Release()
				}
				polled := e.client.Stats().Polled
				if got := polled > 0; got != tc.wantPolled {
					t.Fatalf("Stats.Polled %d after 100 calls, want any: %v", polled, tc.wantPolled)
				}
			})
		}
	}
}
