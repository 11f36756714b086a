package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// echo answers with the request, built in registered memory.
var echo = HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
	b, err := w.Buffer(len(req))
	if err != nil {
		_ = w.Write(StatusInternal, []byte(err.Error()))
		return
	}
	copy(b, req)
	_ = w.Write(StatusOK, b)
})

func payload(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed ^ byte(i>>9)
	}
	return b
}

func TestEchoSizes(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, echo, Config{})
			thr := e.conn.EagerLimit() // the fabric's: 16 KiB in process, 66 KiB on TCP
			sizes := []int{0, 1, thr - 1, thr, thr + 1, 64 << 10, 1 << 20, 16 << 20, 64 << 20}
			for _, n := range sizes {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					req := payload(n, byte(n))
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					resp, err := e.conn.Call(ctx, req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Release()
					if resp.Status() != StatusOK || crc32.ChecksumIEEE(resp.Bytes()) != crc32.ChecksumIEEE(req) || len(resp.Bytes()) != n {
						t.Fatalf("status %d, %d bytes, checksum mismatch", resp.Status(), len(resp.Bytes()))
					}
				})
			}
		})
	}
}

func TestConcurrentCalls(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, echo, Config{})
			const calls = 1000
			sizes := []int{16, 4096, 100 << 10}
			var wg sync.WaitGroup
			errs := make(chan error, calls)
			for i := 0; i < calls; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					req := payload(sizes[i%len(sizes)], byte(i))
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					resp, err := e.conn.Call(ctx, req)
					if err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(resp.Bytes(), req) {
						errs <- fmt.Errorf("call %d: response differs", i)
					}
					resp.Release()
				}(i)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestRevocation: once a call with a large response returns, the response window's rkey
// no longer reads anything: a READ through it completes with REM_ACCESS_ERR. (The request
// is small: a large one's response would be written into the request's window on TCP.)
func TestRevocation(t *testing.T) {
	big := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) { _ = w.Write(StatusOK, payload(1<<20, 1)) })
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, big, Config{})
			var rkey uint32
			var addr uint64
			hook := func(h *wire.Header) { rkey, addr = h.RKey, h.Addr }
			e.client.testHookLarge.Store(&hook)
			resp, err := e.conn.Call(context.Background(), []byte("get"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Release()
			if rkey == 0 {
				t.Fatal("the response did not come through a window")
			}
			// The invalidation is on its way or done: wait for the server to see it.
			e.checkWindows(t)
			buf, err := e.client.pool.TryGet(64)
			if err != nil {
				t.Fatal(err)
			}
			defer buf.Release()
			c := e.conn
			wr := []verbs.SendWR{{WRID: wrid(wrRead, c.id, 0), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{buf.SGE()}, RemoteAddr: addr, RKey: rkey}}
			if c.rd.ops[0] != nil { // (made on first use)
				c.rd.ops[0].live = false
			}
			var status verbs.WCStatus
			wcHook := func(wc *verbs.WorkCompletion) {
				if wc.WRID == wr[0].WRID {
					status = wc.Status
				}
			}
			c.t.testHookWC.Store(&wcHook)
			if err := c.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			select {
			case <-c.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the stale READ did not fail the connection")
			}
			if status != verbs.WCRemAccessErr {
				t.Fatalf("READ through the revoked window: %v, want REM_ACCESS_ERR", status)
			}
		})
	}
}

// TestZeroCopy: a 1 MiB response over the TCP fabric is copied once per side in user
// space, at the socket: the server's handler builds it in registered memory, the NIC
// streams it from there, the client's NIC reads it straight into registered memory.
func TestZeroCopy(t *testing.T) {
	const n = 1 << 20
	resp := payload(n, 9)
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		b, _ := w.Buffer(n)
		copy(b, resp) // the application's own encoding, not counted
		_ = w.Write(StatusOK, b)
	})
	e := newEnv(t, fabrics[1], h, Config{})
	call := func() {
		r, err := e.conn.Call(context.Background(), []byte("get"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Bytes(), resp) {
			t.Fatal("response differs")
		}
		r.Release()
	}
	call() // warm up
	cs, ss := e.cdev.(*soft.Device).Stats(), e.sdev.(*soft.Device).Stats()
	const calls = 8
	for i := 0; i < calls; i++ {
		call()
	}
	cs2, ss2 := e.cdev.(*soft.Device).Stats(), e.sdev.(*soft.Device).Stats()
	perCall := func(a, b uint64) float64 { return float64(b-a) / calls / n }
	client := perCall(cs.SocketRxBytes+cs.CopyBytes, cs2.SocketRxBytes+cs2.CopyBytes)
	server := perCall(ss.SocketTxBytes+ss.CopyBytes, ss2.SocketTxBytes+ss2.CopyBytes)
	t.Logf("payload copies per call: client %.3f, server %.3f (socket boundary included)", client, server)
	if client > 1.01 || server > 1.01 {
		t.Fatalf("more than one copy per side: client %.3f, server %.3f", client, server)
	}
}

func TestTooLarge(t *testing.T) {
	e := newEnv(t, fabrics[0], echo, Config{MaxMessage: 1 << 20})
	_, err := e.conn.Call(context.Background(), make([]byte, 1<<20+1))
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	// The connection still works.
	r, err := e.conn.Call(context.Background(), []byte("ok"))
	if err != nil {
		t.Fatal(err)
	}
	r.Release()
}

func TestPanicAndUnimplemented(t *testing.T) {
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		if string(req) == "panic" {
			panic("boom")
		}
		_ = w.Write(StatusOK, req)
	})
	e := newEnv(t, fabrics[0], h, Config{})
	r, err := e.conn.Call(context.Background(), []byte("panic"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Status() != StatusInternal || !strings.Contains(string(r.Bytes()), "boom") {
		t.Fatalf("status %d %q", r.Status(), r.Bytes())
	}
	r.Release()
	r, err = e.conn.Call(context.Background(), []byte("still serving"))
	if err != nil || r.Status() != StatusOK {
		t.Fatalf("%v %v", r, err)
	}
	r.Release()
}

func TestCancelPropagates(t *testing.T) {
	started, canceled := make(chan struct{}), make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		close(started)
		select {
		case <-ctx.Done():
			close(canceled)
		case <-time.After(10 * time.Second):
		}
	})
	e := newEnv(t, fabrics[1], h, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	if _, err := e.conn.Call(ctx, []byte("slow")); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not canceled")
	}
}

// blockingHandler answers nothing until block is closed or the call's context ends.
func blockingHandler(block <-chan struct{}) Handler {
	return HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		select {
		case <-block:
		case <-ctx.Done():
		}
	})
}

func TestDeadPeer(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			block := make(chan struct{})
			e := newEnv(t, fb, blockingHandler(block), Config{})
			errs := make(chan error, 10)
			for i := 0; i < 10; i++ {
				go func() {
					_, err := e.conn.Call(context.Background(), payload(100<<10, 1))
					errs <- err
				}()
			}
			time.Sleep(50 * time.Millisecond)
			// The server side of the connection dies.
			e.serverConn(t).Close()
			for i := 0; i < 10; i++ {
				select {
				case err := <-errs:
					if !errors.Is(err, ErrUnavailable) {
						t.Fatalf("call: %v, want ErrUnavailable", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("a call did not fail after the peer died")
				}
			}
			close(block)
		})
	}
}
