package transport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestCallBufGathered: a request built in registered memory (CallBuf) up to the eager
// threshold leaves inside its SEND gathered from where it lies (under gatherBufMin copied
// behind the header): the send slot never grows to the payload's size, the server gets
// the bytes intact on either side of the threshold, and the buffer goes back to the pool
// once its SEND completes.
func TestCallBufGathered(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			cdev, sdev := fb.open(t)
			_, c := dialPairOn(t, cdev, sdev, Config{}, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, size := range []int{1, 100, gatherBufMin - 1, gatherBufMin, smallSendSlot, c.eager} {
				buf, want := fillBuf(ctx, t, c, size)
				resp, err := c.CallBuf(ctx, buf)
				if err != nil {
					t.Fatalf("CallBuf of %d bytes: %v", size, err)
				}
				if !bytes.Equal(resp.Bytes(), want) {
					t.Fatalf("CallBuf of %d bytes: echo of %d bytes differs", size, len(resp.Bytes()))
				}
				resp.Release()
			}
			checkGathered(t, c)
		})
	}
}

// TestGatheredSmall: a buffer part under gatherBufMin is the sender's to copy; a larger
// one, one behind a tail, a receive slot's part and no part at all are gathered as they
// are.
func TestGatheredSmall(t *testing.T) {
	buf := new(pool.Buf) // small looks at the part's length, not into the buffer
	for _, tc := range []struct {
		name string
		g    gathered
		tail []byte
		want *pool.Buf
	}{
		{"a buffer of 0 bytes", gathered{buf: buf}, nil, buf},
		{"a buffer of 1 byte", gathered{sge: verbs.SGE{Length: 1}, buf: buf}, nil, buf},
		{"a buffer of gatherBufMin-1 bytes", gathered{sge: verbs.SGE{Length: gatherBufMin - 1}, buf: buf}, nil, buf},
		{"a buffer of gatherBufMin bytes", gathered{sge: verbs.SGE{Length: gatherBufMin}, buf: buf}, nil, nil},
		{"a buffer of 4 KiB", gathered{sge: verbs.SGE{Length: 4 << 10}, buf: buf}, nil, nil},
		{"a buffer of 64 bytes behind a tail", gathered{sge: verbs.SGE{Length: 64}, buf: buf}, []byte("tail"), nil},
		{"a receive slot's 64 bytes", gathered{sge: verbs.SGE{Length: 64}, recv: 1}, nil, nil},
		{"no part", gathered{}, nil, nil},
	} {
		if got := tc.g.small(tc.tail); got != tc.want {
			t.Errorf("%s: small() = %p, want %p", tc.name, got, tc.want)
		}
	}
}

// TestCallBufSmallCopied: a request built in registered memory under gatherBufMin is
// copied into its send slot and its buffer released before the SEND is posted: the
// handler, which has not answered, finds it back in the pool. Gathered, it would stay out
// until the SEND completed, which with no response to carry the peer's ACK takes the
// ACK's delay.
func TestCallBufSmallCopied(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			started, answer := make(chan struct{}), make(chan struct{})
			e := newEnv(t, fb, HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
				started <- struct{}{}
				<-answer
				_ = w.Write(StatusOK, req)
			}), Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			buf, want := fillBuf(ctx, t, e.conn, 100)
			addr := buf.Addr()
			done := make(chan error, 1)
			go func() {
				resp, err := e.conn.CallBuf(ctx, buf)
				if err == nil {
					if !bytes.Equal(resp.Bytes(), want) {
						err = fmt.Errorf("echo of %d bytes differs from the request", len(resp.Bytes()))
					}
					resp.Release()
				}
				done <- err
			}()
			<-started
			for _, l := range e.conn.t.pool.Outstanding() {
				if l.Addr == addr {
					t.Errorf("the request's buffer (%d bytes) is still out while its handler runs: gathered, not copied", len(want))
				}
			}
			close(answer)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// fillBuf takes a pool buffer of size bytes from c's transport and fills it with a
// pattern; it returns the buffer and a copy of its bytes.
func fillBuf(ctx context.Context, t *testing.T, c *Conn, size int) (*pool.Buf, []byte) {
	t.Helper()
	buf, err := c.t.pool.Get(ctx, size)
	if err != nil {
		t.Fatal(err)
	}
	buf.SetLen(size)
	b := buf.Bytes()
	for i := range b {
		b[i] = byte(i*7 + size)
	}
	return buf, bytes.Clone(b)
}

// checkGathered fails if a send slot of c grew past smallSendSlot (a message in
// registered memory was copied into it) or still holds a gathered buffer after 5 s. A
// slot being filled is its poster's until postedSlot, outside Conn.mu (a handler whose
// response the caller already has may not have got there yet): it counts as held.
func checkGathered(t *testing.T, c *Conn) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		held, grown := 0, 0
		for _, s := range c.out.slots {
			if s == nil {
				continue
			}
			if s.state.Load() != slotPosted {
				held++
				continue
			}
			if s.g.buf != nil || s.g.recv > 0 {
				held++
			}
			if s.buf != nil && s.buf.Cap() > smallSendSlot+64 {
				grown++
			}
		}
		c.mu.Unlock()
		if grown > 0 {
			t.Fatalf("%d send slots grew past %d bytes: a message in registered memory was copied into its slot", grown, smallSendSlot)
		}
		if held == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d send slots still hold their gathered message after 5 s", held)
		}
	}
}

// TestStreamSendBufGathered: a stream message built in registered memory (SendBuf) up
// to the eager threshold leaves gathered, as CallBuf's request does.
func TestStreamSendBufGathered(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, streamEcho, Config{StreamWindow: 256 << 10})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := e.conn.OpenStream(ctx, []byte("echo"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			sizes := []int{1, 100, gatherBufMin - 1, gatherBufMin, smallSendSlot, e.conn.eager}
			for _, size := range sizes {
				buf, want := fillBuf(ctx, t, e.conn, size)
				if err := st.SendBuf(ctx, buf); err != nil {
					t.Fatalf("SendBuf of %d bytes: %v", size, err)
				}
				m, err := st.Recv(ctx)
				if err != nil {
					t.Fatalf("echo of %d bytes: %v", size, err)
				}
				if !bytes.Equal(m, want) {
					t.Fatalf("echo of %d bytes: %d bytes, not what was sent", size, len(m))
				}
			}
			if err := st.CloseSend(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(ctx); err != io.EOF {
				t.Fatalf("after the last message: %v, want io.EOF", err)
			}
			if status, p, ok := st.Final(); !ok || status != StatusOK || string(p) != fmt.Sprintf("echo:%d", len(sizes)) {
				t.Fatalf("final: %d %q %v", status, p, ok)
			}
			checkGathered(t, e.conn)
		})
	}
}

// TestResponseGatheredFromRequest: a response that is its request's own bytes (an echo
// written from req) leaves from the request's receive slot without a copy, and the slot is
// posted again only once both the handler has returned and the SEND has completed: a
// handler that reads req after writing it finds it unchanged while other callers' requests
// keep arriving, and no send slot grows to the responses' size.
func TestResponseGatheredFromRequest(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			var changed atomic.Int32
			h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
				orig := bytes.Clone(req)
				_ = w.Write(StatusOK, req)
				time.Sleep(100 * time.Microsecond) // its SEND completes meanwhile, and more requests come
				if !bytes.Equal(req, orig) {
					changed.Add(1)
				}
			})
			// Slots of 64 KiB on every fabric (the in-process one's default eager threshold
			// is below gatherRequestMin): the responses up to 1 KiB are copied, the others
			// gathered.
			e := newEnv(t, fb, h, Config{SlotSize: 66 << 10, EagerThreshold: 64 << 10})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if e.conn.eager < 64<<10 {
				t.Fatalf("eager threshold %d, want 64 KiB", e.conn.eager)
			}
			sizes := []int{100, 1 << 10, gatherRequestMin, e.conn.eager}
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 40 {
						req := payload(sizes[i%len(sizes)], byte(g*40+i))
						resp, err := e.conn.Call(ctx, req)
						if err != nil {
							errs <- err
							return
						}
						ok := bytes.Equal(resp.Bytes(), req)
						resp.Release()
						if !ok {
							errs <- fmt.Errorf("caller %d call %d: the echo of %d bytes differs", g, i, len(req))
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if n := changed.Load(); n > 0 {
				t.Fatalf("%d handlers found their request changed after writing it: its receive slot was posted again too soon", n)
			}
			checkGathered(t, e.serverConn(t))
		})
	}
}

// TestCallBufEmpty: an empty request built in registered memory goes back to the pool too
// once its SEND completed (it has no bytes to gather, but the send slot owns it).
func TestCallBufEmpty(t *testing.T) {
	e := newEnv(t, tcpFabric, echo, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inUse := func() int {
		n := 0
		for _, c := range e.client.pool.Stats().Classes {
			n += c.InUse
		}
		return n
	}
	resp, err := e.conn.Call(ctx, []byte("warm-up")) // the send slot is made
	if err != nil {
		t.Fatal(err)
	}
	resp.Release()
	before := inUse()
	buf, err := e.conn.t.pool.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	buf.SetLen(0)
	if resp, err = e.conn.CallBuf(ctx, buf); err != nil {
		t.Fatal(err)
	}
	if len(resp.Bytes()) != 0 {
		t.Fatalf("echo of an empty request: %d bytes", len(resp.Bytes()))
	}
	resp.Release()
	for deadline := time.Now().Add(5 * time.Second); inUse() != before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pool buffers in use, %d before the call: the empty request's buffer was not released", inUse(), before)
		}
	}
}

// TestSendSlotHandOver: a sender leaves its send slot without Conn.mu unless the SEND
// completed meanwhile (then the sender frees it) or the connection was torn down; a
// completion that comes after the sender left frees the slot itself.
func TestSendSlotHandOver(t *testing.T) {
	e := newEnv(t, tcpFabric, echo, Config{})
	c := e.conn
	take := func() (int, *sendSlot) {
		t.Helper()
		c.mu.Lock()
		defer c.mu.Unlock()
		i, s, err := c.takeSendLocked(context.Background(), 64, sendWait)
		if err != nil {
			t.Fatal(err)
		}
		return i, s
	}
	free := func(i int) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return slices.Contains(c.out.free, i)
	}

	// Completed while its sender still filled it: the sender frees it.
	i, s := take()
	c.onSent(i)
	if s.state.Load() != slotDone || free(i) {
		t.Fatalf("a SEND completed during its filling: state %d, free %v; want slotDone, not free", s.state.Load(), free(i))
	}
	c.postedSlot(i, s)
	if s.state.Load() != slotPosted || !free(i) {
		t.Fatalf("its sender left it: state %d, free %v; want slotPosted and free", s.state.Load(), free(i))
	}

	// Left by its sender first, which takes no lock; then its completion frees it.
	i, s = take()
	doneWhileLocked(t, &c.mu, "a sender leaving its slot whose SEND is in flight", func() { c.postedSlot(i, s) })
	if free(i) {
		t.Fatal("a slot whose SEND is in flight was freed")
	}
	c.onSent(i)
	if !free(i) {
		t.Fatal("the completion of a SEND whose sender had left did not free its slot")
	}
}
