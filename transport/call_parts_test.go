package transport

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// TestParts: a request sent in two parts (Conn.CallParts) arrives as the one message they
// make, head then body, and a response written in two parts (ResponseWriter.WriteParts)
// comes back as one: inside the SEND up to the eager threshold (the parts copied straight
// into the send slot), joined in registered memory above it; an empty part, either one,
// is no part.
func TestParts(t *testing.T) {
	// The handler answers in two parts: the request's first byte, then the rest.
	split := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		if len(req) == 0 {
			_ = w.WriteParts(StatusOK, nil, nil)
			return
		}
		_ = w.WriteParts(StatusOK, req[:1], req[1:])
	})
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, split, Config{})
			eager := e.conn.EagerLimit()
			for _, tc := range []struct{ head, body int }{
				{0, 0}, {10, 0}, {0, 10}, {16, 100}, {100, eager - 100}, {100, eager - 99},
				{1, eager}, {200, 256 << 10},
			} {
				t.Run(fmt.Sprintf("%d+%d", tc.head, tc.body), func(t *testing.T) {
					want := payload(tc.head+tc.body, byte(tc.head))
					head, body := bytes.Clone(want[:tc.head]), bytes.Clone(want[tc.head:])
					resp, err := e.conn.CallParts(context.Background(), head, body)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Release()
					if !bytes.Equal(resp.Bytes(), want) {
						t.Fatalf("%d bytes back, want the %d of head and body", len(resp.Bytes()), len(want))
					}
					if large := tc.head+tc.body > eager; resp.Windowed() != large {
						t.Errorf("response windowed %v, want %v (eager threshold %d)", resp.Windowed(), large, eager)
					}
				})
			}
		})
	}
}
