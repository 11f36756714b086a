package mwnet

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport"
)

// TestWritesGathered: small Writes that come while another Write waits for the peer's
// window go out together, as one SEND, once it is done; each Write's bytes stay whole.
// The listener's side writes (its transport's Stats count the SENDs) to a dialer with the
// smallest window that reads only once every writer waits.
func TestWritesGathered(t *testing.T) {
	const writers, size = 20, 100
	for name, target := range targets(t) {
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			l := listen(t, target)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := Dial(ctx, l.Addr().String(), WithTransport(transport.Config{StreamWindow: 64 << 10}))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			nc, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			s := nc.(*Conn)
			defer s.Close()

			fill := make([]byte, 60<<10) // most of the window: the next Write waits for the reader
			if _, err := s.Write(fill); err != nil {
				t.Fatal(err)
			}
			before := l.Stats().Sends
			errs, waiting := make(chan error, writers+1), make(chan error, 1)
			go func() { _, err := s.Write(make([]byte, 8<<10)); waiting <- err }() // waits for window
			waitGathered(t, s, 0)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					rec := make([]byte, size)
					binary.LittleEndian.PutUint32(rec, uint32(w))
					if _, err := s.Write(rec); err != nil {
						errs <- err
					}
				})
			}
			waitGathered(t, s, writers) // every writer's record waits in the batch
			got := make([]byte, len(fill)+8<<10+writers*size)
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			errs <- <-waiting
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := checkRecords(got[len(fill)+8<<10:], writers, size); err != nil {
				t.Fatal(err)
			}
			// Without gathering: the waiting Write, its wait signal and a SEND per record,
			// 22. With it: 3, and perhaps a credit release or two for the reader's acks.
			sends := l.Stats().Sends - before
			t.Logf("%d Writes of %d bytes while another waited: %d SENDs in all", writers, size, sends)
			if sends > 8 {
				t.Errorf("%d SENDs, want at most 8: the records were not gathered into one", sends)
			}
		})
	}
}

// waitGathered waits until a Write holds c's stream and n Writes wait in its batch.
func waitGathered(t *testing.T, c *Conn, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.gather.mu.Lock()
		ok := c.gather.sending && (n == 0 || c.gather.next != nil && c.gather.next.writers == n)
		c.gather.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %d gathered Writes", n)
		}
	}
}

// checkRecords checks that b is whole records of size bytes (the writer, u32, then
// zeros), one from each writer.
func checkRecords(b []byte, writers, size int) error {
	seen := make([]bool, writers)
	for off := 0; off < len(b); off += size {
		w := binary.LittleEndian.Uint32(b[off:])
		if int(w) >= writers || seen[w] || !bytes.Equal(b[off+4:off+size], make([]byte, size-4)) {
			return fmt.Errorf("record at %d (writer %d): torn, or twice", off, w)
		}
		seen[w] = true
	}
	return nil
}
