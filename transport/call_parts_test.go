package transport

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/mwrpc/mwrpc/internal/parcopy"
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

// TestCopyInSplits: Conn.CopyIn copies every byte, and splits a copy over helpers where
// the connection's fabric makes that pay: over shared memory (shm) from 256 KiB, over a
// socket or in process only from 4 MiB.
func TestCopyInSplits(t *testing.T) {
	defer parcopy.SetHelpers(2)()
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, echo, Config{})
			placed := fb.name == "shm"
			for _, n := range []int{256<<10 - 1, 256 << 10, 1 << 20, 4<<20 - 1, 4 << 20} {
				src, dst := payload(n, byte(n>>10)), make([]byte, n)
				before := parcopy.Splits()
				if got := e.conn.CopyIn(dst, src); got != n || !bytes.Equal(dst, src) {
					t.Fatalf("CopyIn of %d bytes copied %d, equal %v", n, got, bytes.Equal(dst, src))
				}
				want := n >= 4<<20 || placed && n >= 256<<10
				if split := parcopy.Splits() != before; split != want {
					t.Errorf("CopyIn of %d bytes: split %v, want %v", n, split, want)
				}
			}
		})
	}
}
