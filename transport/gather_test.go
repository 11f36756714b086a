package transport

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestCallBufGathered: a request built in registered memory (CallBuf) up to the eager
// threshold leaves inside its SEND gathered from where it lies: the send slot carries the
// header alone and never grows to the payload's size, the server gets the bytes intact,
// and the buffer goes back to the pool once its SEND completes.
func TestCallBufGathered(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			cdev, sdev := fb.open(t)
			_, c := dialPairOn(t, cdev, sdev, Config{}, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, size := range []int{1, 100, smallSendSlot, c.eager} {
				buf, err := c.t.pool.Get(ctx, size)
				if err != nil {
					t.Fatal(err)
				}
				buf.SetLen(size)
				want := buf.Bytes()
				for i := range want {
					want[i] = byte(i*7 + size)
				}
				want = bytes.Clone(want)
				resp, err := c.CallBuf(ctx, buf)
				if err != nil {
					t.Fatalf("CallBuf of %d bytes: %v", size, err)
				}
				if !bytes.Equal(resp.Bytes(), want) {
					t.Fatalf("CallBuf of %d bytes: echo of %d bytes differs", size, len(resp.Bytes()))
				}
				resp.Release()
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				c.mu.Lock()
				held, grown := 0, 0
				for _, s := range c.out.slots {
					if s == nil {
						continue
					}
					if s.body != nil {
						held++
					}
					if s.buf != nil && s.buf.Cap() > smallSendSlot+64 {
						grown++
					}
				}
				c.mu.Unlock()
				if grown > 0 {
					t.Fatalf("%d send slots grew past %d bytes: a request in registered memory was copied into its slot", grown, smallSendSlot)
				}
				if held == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d send slots still hold their gathered request after 5 s", held)
				}
			}
		})
	}
}
