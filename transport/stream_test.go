package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// streamEcho sends back every message of a stream, then answers "done" with the count.
var streamEcho = HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
	st := w.Stream()
	if st == nil {
		_ = w.Write(StatusUnimplemented, []byte("not a stream"))
		return
	}
	n := 0
	for {
		m, err := st.Recv(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			_ = w.Write(StatusInternal, []byte(err.Error()))
			return
		}
		if err := st.Send(ctx, m); err != nil {
			_ = w.Write(StatusInternal, []byte(err.Error()))
			return
		}
		n++
	}
	_ = w.Write(StatusOK, fmt.Appendf(nil, "%s:%d", req, n))
})

func TestStreamEcho(t *testing.T) {
	for _, fb := range fabrics {
		for _, tc := range []struct {
			name string
			size int
			n    int
		}{
			{"64B", 64, 200},
			{"100KiB", 100 << 10, 40},
			{"1MiB", 1 << 20, 12},
			{"mixed", 0, 60},
		} {
			t.Run(fb.name+"/"+tc.name, func(t *testing.T) {
				e := newEnv(t, fb, streamEcho, Config{StreamWindow: 256 << 10})
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				st, err := e.conn.OpenStream(ctx, []byte("echo"))
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				size := func(i int) int {
					if tc.size != 0 {
						return tc.size
					}
					return []int{0, 10, 20 << 10, 300 << 10}[i%4]
				}
				sent := make(chan error, 1)
				go func() {
					for i := 0; i < tc.n; i++ {
						if err := st.Send(ctx, payload(size(i), byte(i))); err != nil {
							sent <- err
							return
						}
					}
					sent <- st.CloseSend(ctx)
				}()
				for i := 0; i < tc.n; i++ {
					m, err := st.Recv(ctx)
					if err != nil {
						t.Fatalf("recv %d: %v", i, err)
					}
					if !bytes.Equal(m, payload(size(i), byte(i))) {
						t.Fatalf("message %d: %d bytes, not what was sent", i, len(m))
					}
				}
				if err := <-sent; err != nil {
					t.Fatal(err)
				}
				if _, err := st.Recv(ctx); err != io.EOF {
					t.Fatalf("after the last message: %v, want io.EOF", err)
				}
				status, p, ok := st.Final()
				if want := fmt.Sprintf("echo:%d", tc.n); !ok || status != StatusOK || string(p) != want {
					t.Fatalf("final: %d %q %v, want %q", status, p, ok, want)
				}
			})
		}
	}
}

// TestStreamFlowControl: a reader that stops reading holds the sender to the window.
func TestStreamFlowControl(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) { testStreamFlowControl(t, fb) })
	}
}

func testStreamFlowControl(t *testing.T, fb fabric) {
	const window, msg = 256 << 10, 32 << 10
	var sentBytes atomic.Int64
	done := make(chan error, 1)
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		st := w.Stream()
		p := payload(msg, 3)
		for {
			if err := st.Send(ctx, p); err != nil {
				done <- err
				return
			}
			sentBytes.Add(msg)
		}
	})
	e := newEnv(t, fb, h, Config{StreamWindow: window})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := e.conn.OpenStream(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Read a little, then stop: the server may get a window ahead, no more.
	for i := 0; i < 3; i++ {
		if _, err := st.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if n := sentBytes.Load(); n > 3*msg+window {
		t.Fatalf("the sender got %d bytes ahead of a reader that stopped after %d; the window is %d", n, 3*msg, window)
	}
	before := sentBytes.Load()
	// Reading again lets it go on.
	for i := 0; i < 20; i++ {
		if _, err := st.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for sentBytes.Load() <= before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if sentBytes.Load() <= before {
		t.Fatal("the sender did not go on once the reader read again")
	}
	// Closing the stream cancels the handler, whose Send then fails.
	st.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Send succeeded after the caller closed the stream")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's Send did not fail after the caller closed the stream")
	}
}

// TestStreamEnds: a stream ends cleanly on either side's cancel, a handler's early
// answer, a deadline, and the connection's loss; the env's cleanup then finds every
// window revoked and every buffer returned.
func TestStreamEnds(t *testing.T) {
	big := payload(200<<10, 9)
	for _, tc := range []struct {
		name    string
		handler func(ctx context.Context, st *Stream, w *ResponseWriter)
		client  func(t *testing.T, e *env, st *Stream, handled <-chan error)
	}{
		{"server answers early", func(ctx context.Context, st *Stream, w *ResponseWriter) {
			if _, err := st.Recv(ctx); err != nil {
				return
			}
			_ = st.Send(ctx, big)
			_ = w.Write(9, []byte("enough"))
		}, func(t *testing.T, e *env, st *Stream, handled <-chan error) {
			ctx := context.Background()
			var err error
			for i := 0; i < 10000 && err == nil; i++ { // until the server's end stops us
				err = st.Send(ctx, big)
			}
			if err != io.EOF {
				t.Fatalf("Send after the server's answer: %v, want io.EOF", err)
			}
			if m, err := st.Recv(ctx); err != nil || !bytes.Equal(m, big) {
				t.Fatalf("the message before the answer: %d bytes, %v", len(m), err)
			}
			if _, err := st.Recv(ctx); err != io.EOF {
				t.Fatalf("Recv at the end: %v", err)
			}
			if s, p, _ := st.Final(); s != 9 || string(p) != "enough" {
				t.Fatalf("final %d %q", s, p)
			}
		}},
		{"caller cancels", func(ctx context.Context, st *Stream, w *ResponseWriter) {
			for {
				if _, err := st.Recv(ctx); err != nil {
					return
				}
			}
		}, func(t *testing.T, e *env, st *Stream, handled <-chan error) {
			if err := st.Send(context.Background(), big); err != nil {
				t.Fatal(err)
			}
			st.Close()
			if err := <-handled; !errors.Is(err, context.Canceled) {
				t.Fatalf("the handler's Recv: %v, want context.Canceled", err)
			}
			if err := st.Send(context.Background(), big); !errors.Is(err, ErrStreamEnded) {
				t.Fatalf("Send after Close: %v", err)
			}
		}},
		{"deadline", func(ctx context.Context, st *Stream, w *ResponseWriter) {
			_ = st.Send(ctx, big)
			<-ctx.Done()
		}, func(t *testing.T, e *env, st *Stream, handled <-chan error) {
			// The message may take a while on a loaded machine: only the wait for the one
			// that never comes has the short deadline.
			if _, err := st.Recv(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if _, err := st.Recv(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Recv past the deadline: %v", err)
			}
			st.Close()
			<-handled
		}},
		{"connection lost", func(ctx context.Context, st *Stream, w *ResponseWriter) {
			_ = st.Send(ctx, big)
			for {
				if _, err := st.Recv(ctx); err != nil {
					return
				}
			}
		}, func(t *testing.T, e *env, st *Stream, handled <-chan error) {
			ctx := context.Background()
			if _, err := st.Recv(ctx); err != nil {
				t.Fatal(err)
			}
			e.serverConn(t).Close()
			if _, err := st.Recv(ctx); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("Recv after the connection's loss: %v, want ErrUnavailable", err)
			}
			if err := <-handled; err == nil {
				t.Fatal("the handler's Recv succeeded after the connection's loss")
			}
		}},
	} {
		for _, fb := range fabrics {
			t.Run(fb.name+"/"+tc.name, func(t *testing.T) {
				testStreamEnd(t, fb, big, tc.handler, tc.client)
			})
		}
	}
}

// testStreamEnd runs one case of TestStreamEnds: handler serves the stream, then reports
// the error its Recv ends with; client drives it.
func testStreamEnd(t *testing.T, fb fabric, big []byte, handler func(ctx context.Context, st *Stream, w *ResponseWriter), client func(t *testing.T, e *env, st *Stream, handled <-chan error)) {
	handled := make(chan error, 1)
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		st := w.Stream()
		handler(ctx, st, w)
		// Messages that arrived before the end come before its error (Stream.Recv): one
		// whose READ was still under way when the caller canceled completes after the
		// handler's Recv returned the canceled context's error, and is taken here first.
		var err error
		for i := 0; err == nil && i < 1000; i++ {
			_, err = st.Recv(ctx)
		}
		handled <- err
	})
	e := newEnv(t, fb, h, Config{StreamWindow: 256 << 10})
	st, err := e.conn.OpenStream(context.Background(), big) // a large request too
	if err != nil {
		t.Fatal(err)
	}
	client(t, e, st, handled)
	st.Close()
}

// TestStreamOverrun: a peer that sends past the window it was granted, after its own end,
// or acks (on a message) more than was sent, fails the connection with ErrProtocol.
func TestStreamOverrun(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, st *Stream) error
	}{
		{"past the window", func(ctx context.Context, st *Stream) error {
			st.mu.Lock()
			st.peerWindow = 1 << 30 // a sender that ignores the window
			st.mu.Unlock()
			var err error
			for i := 0; i < 64 && err == nil; i++ {
				err = st.Send(ctx, payload(8<<10, 1))
				time.Sleep(time.Millisecond)
			}
			return nil
		}},
		{"after its end", func(ctx context.Context, st *Stream) error {
			if err := st.CloseSend(ctx); err != nil {
				return err
			}
			h := st.header(wire.KindStreamMsg) // what Send would refuse to send now
			_, err := st.c.send(ctx, &h, []byte("more"), nil, revoke{}, sendWait)
			return err
		}},
		{"acks more than was sent", func(ctx context.Context, st *Stream) error {
			h := st.header(wire.KindStreamMsg)
			h.RKey = 1 << 20 // an ack riding the message, for bytes the server never sent
			_, err := st.c.send(ctx, &h, []byte("x"), nil, revoke{}, sendWait)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			block := make(chan struct{})
			h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
				select {
				case <-block:
				case <-ctx.Done():
				}
			})
			e := newEnv(t, fabrics[1], h, Config{StreamWindow: 64 << 10})
			defer close(block)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := e.conn.OpenStream(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			time.Sleep(200 * time.Millisecond) // the server's first ack, which sets the window, has come
			if err := tc.run(ctx, st); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for e.server.Stats().Protocol == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if n := e.server.Stats().Protocol; n != 1 {
				t.Fatalf("the server counted %d protocol failures, want 1", n)
			}
			if _, err := st.Recv(ctx); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("the caller's Recv after: %v, want ErrUnavailable", err)
			}
		})
	}
}

func TestStreamUnaryHandlerSeesNoStream(t *testing.T) {
	var saw atomic.Bool
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) { saw.Store(w.Stream() != nil) })
	e := newEnv(t, fabrics[0], h, Config{})
	resp, err := e.conn.Call(context.Background(), []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Release()
	if saw.Load() {
		t.Fatal("a plain call's handler got a stream")
	}
}

// TestStreamFullPool: a stream whose messages find the receiver's pool full ends with an
// error on both sides, and the connection goes on serving.
func TestStreamFullPool(t *testing.T) {
	handled := make(chan error, 1)
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		st := w.Stream()
		if st == nil {
			_ = w.Write(StatusOK, []byte("plain"))
			return
		}
		<-ctx.Done() // never reads: the messages pile up to the window, past the pool
		var err error
		for err == nil { // what arrived before comes first
			_, err = st.Recv(context.Background())
		}
		handled <- err
		_ = w.Write(StatusResourceExhausted, []byte(err.Error()))
	})
	e := newEnv(t, fabrics[1], h, Config{StreamWindow: 32 << 20, MaxMessage: 1 << 20, SharedReceives: -1, Pool: pool.Config{MaxBytes: 12 << 20}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := e.conn.OpenStream(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := 0; i < 30; i++ {
		if err := st.Send(ctx, payload(1<<20, byte(i))); err != nil {
			break // the server ended the stream (io.EOF)
		}
	}
	if err := <-handled; err == nil || !strings.Contains(err.Error(), "no registered memory for a stream message") {
		t.Fatalf("the handler's Recv: %v", err)
	}
	if _, err := st.Recv(ctx); err != io.EOF {
		t.Fatalf("the caller's Recv: %v, want io.EOF", err)
	}
	if s, _, _ := st.Final(); s != StatusResourceExhausted {
		t.Fatalf("final status %d", s)
	}
	resp, err := e.conn.Call(ctx, []byte("after"))
	if err != nil {
		t.Fatalf("a call after the stream: %v", err)
	}
	resp.Release()
}

// TestStreamStress: many streams at once on one connection, of mixed sizes, some closed
// early by the caller and some ended early by the handler, beside plain calls; the env's
// cleanup then finds every window revoked, every buffer returned and no goroutine left.
func TestStreamStress(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
				st := w.Stream()
				if st == nil {
					_ = w.Write(StatusOK, req)
					return
				}
				stopAt := int(req[0]) // the handler ends after this many messages (255: never)
				for i := 0; ; i++ {
					if i == stopAt {
						_ = w.Write(9, []byte("stopped early"))
						return
					}
					m, err := st.Recv(ctx)
					if err != nil {
						return
					}
					if err := st.Send(ctx, m); err != nil {
						return
					}
				}
			})
			e := newEnv(t, fb, h, Config{StreamWindow: 128 << 10, Windows: 16})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			sizes := []int{0, 64, 20 << 10, 150 << 10}
			done := make(chan error, 24)
			for g := 0; g < 24; g++ {
				go func() {
					done <- func() error {
						if g%4 == 3 { // plain calls beside the streams
							for i := 0; i < 50; i++ {
								resp, err := e.conn.Call(ctx, payload(sizes[i%4], byte(i)))
								if err != nil {
									return err
								}
								resp.Release()
							}
							return nil
						}
						stopAt := byte(255)
						if g%3 == 1 {
							stopAt = byte(3 + g%5)
						}
						st, err := e.conn.OpenStream(ctx, []byte{stopAt})
						if err != nil {
							return err
						}
						defer st.Close()
						for i := 0; i < 20; i++ {
							if g%3 == 2 && i == 2+g%4 {
								return nil // the caller walks away: Close cancels
							}
							p := payload(sizes[(i+g)%4], byte(i))
							if err := st.Send(ctx, p); err == io.EOF {
								break // the handler ended the stream
							} else if err != nil {
								return fmt.Errorf("stream %d send %d: %w", g, i, err)
							}
							m, err := st.Recv(ctx)
							if err == io.EOF {
								break
							}
							if err != nil {
								return fmt.Errorf("stream %d recv %d: %w", g, i, err)
							}
							if !bytes.Equal(m, p) {
								return fmt.Errorf("stream %d message %d: %d bytes, not what was sent", g, i, len(m))
							}
						}
						return nil
					}()
				}()
			}
			for g := 0; g < 24; g++ {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestStreamBlockedSender: a sender whose next message is larger than what its window has
// left waits for an ack while the reader, having consumed everything, waits for that
// message. Acks of their own go only to a sender that says it waits, so this stalls (and
// the test fails at its deadline) if that signal or its answer is lost, whether the reader
// was idle when the signal came or consumed the last message only after it.
func TestStreamBlockedSender(t *testing.T) {
	const window = minStreamWindow
	for _, fb := range fabrics {
		for _, late := range []bool{false, true} {
			name := fb.name + "/reader_idle"
			if late {
				name = fb.name + "/reader_late"
			}
			t.Run(name, func(t *testing.T) { testStreamBlockedSender(t, fb, window, late) })
		}
	}
}

func testStreamBlockedSender(t *testing.T, fb fabric, window int, late bool) {
	small, big := payload(100, 1), payload(window-msgCost, 2) // big fits the window only when nothing is outstanding
	goRead := make(chan struct{})
	got := make(chan error, 1)
	h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
		st := w.Stream()
		<-goRead
		for _, want := range [][]byte{small, big} {
			m, err := st.Recv(ctx)
			if err == nil && !bytes.Equal(m, want) {
				err = fmt.Errorf("got %d bytes, want %d", len(m), len(want))
			}
			if err != nil {
				got <- err
				_ = w.Write(StatusInternal, nil)
				return
			}
		}
		got <- nil
		_ = w.Write(StatusOK, nil)
	})
	e := newEnv(t, fb, h, Config{StreamWindow: window})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := e.conn.OpenStream(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !late {
		close(goRead) // the reader takes small and waits, idle, for big
	}
	if err := st.Send(ctx, small); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server's window ack", func() bool { st.mu.Lock(); defer st.mu.Unlock(); return st.peerWindow == window })
	sent := make(chan error, 1)
	go func() { sent <- st.Send(ctx, big) }()
	if late {
		waitFor(t, "the sender to say it waits", func() bool { st.mu.Lock(); defer st.mu.Unlock(); return st.saidBlocked })
		close(goRead) // the reader consumes small only now
	}
	snap := e.snapshotAfter(3 * time.Second) // long past the exchange's time, short of the retry limit
	for _, ch := range []chan error{sent, got} {
		if err := <-ch; err != nil {
			t.Fatalf("stalled or failed: %v (%s)\nsnapshot %s", err, e.describe(), snap.stop())
		}
	}
	if text := snap.stop(); text != "" {
		t.Logf("the exchange took more than 3s; snapshot %s", text)
	}
	if _, err := st.Recv(ctx); err != io.EOF {
		t.Fatalf("end: %v, want io.EOF", err)
	}
	if n := e.client.Stats().StreamAcks; n != 1 {
		t.Errorf("the client sent %d stream acks of its own, want 1 (its wait signal)", n)
	}
}

// waitFor polls cond for 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
	}
}

// TestStreamAcksRide: request/response traffic on a stream returns its window on the
// messages going back: no stream ack of its own, two SENDs per exchange.
func TestStreamAcksRide(t *testing.T) {
	const n = 200
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e, exchange := echoExchange(t, fb, payload(64, 5))
			exchange() // the server's first ack (its window) is behind us
			c0, s0 := e.client.Stats(), e.server.Stats()
			for range n {
				exchange()
			}
			c1, s1 := e.client.Stats(), e.server.Stats()
			sends := float64(c1.Sends-c0.Sends+s1.Sends-s0.Sends) / n
			t.Logf("%.2f SENDs per exchange (client %d, server %d), stream acks: client %d, server %d",
				sends, c1.Sends-c0.Sends, s1.Sends-s0.Sends, c1.StreamAcks-c0.StreamAcks, s1.StreamAcks-s0.StreamAcks)
			if c1.StreamAcks != c0.StreamAcks || s1.StreamAcks != s0.StreamAcks {
				t.Errorf("stream acks of their own in request/response traffic: client %d, server %d; want none",
					c1.StreamAcks-c0.StreamAcks, s1.StreamAcks-s0.StreamAcks)
			}
			if sends > 2.1 { // a credit release now and then, no more
				t.Errorf("%.2f SENDs per exchange, want 2", sends)
			}
		})
	}
}

// echoExchange opens a stream to a server that echoes each message, and returns the
// server and client and an exchange: msg sent, its echo received. The stream closes at the
// test's cleanup.
func echoExchange(t *testing.T, fb fabric, msg []byte) (*env, func()) {
	t.Helper()
	e := newEnv(t, fb, streamEcho, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := e.conn.OpenStream(ctx, []byte("echo"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return e, func() {
		t.Helper()
		if err := st.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStreamAckWakesNoReader: an ack (here the window the server grants) wakes a Send
// waiting for window, never a Recv waiting for a message: the reader would find nothing
// and park again, one goroutine hand-off for nothing per message that carries an ack.
// A message then wakes the Recv.
func TestStreamAckWakesNoReader(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			release := make(chan struct{})
			e := newEnv(t, fb, HandlerFunc(func(ctx context.Context, _ []byte, w *ResponseWriter) {
				select {
				case <-release:
				case <-ctx.Done():
				}
				_ = w.Write(StatusOK, []byte("done"))
			}), Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := e.conn.OpenStream(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			waitFor(t, "the server's window ack", func() bool { st.mu.Lock(); defer st.mu.Unlock(); return st.peerWindow != minStreamWindow })
			got := make(chan error, 1)
			go func() { _, err := st.Recv(ctx); got <- err }()
			var wake chan struct{}
			waitFor(t, "Recv to wait", func() bool { st.mu.Lock(); defer st.mu.Unlock(); wake = st.recvWake; return wake != nil })
			if !st.onAck(0, 2*minStreamWindow) {
				t.Fatal("onAck refused a window ack")
			}
			select {
			case <-wake:
				t.Fatal("an ack woke the waiting Recv")
			default:
			}
			close(release) // the response: Recv returns io.EOF
			if err := <-got; err != io.EOF {
				t.Fatalf("Recv after the response: %v, want io.EOF", err)
			}
		})
	}
}

// TestStreamExchangeAllocs: a 64 B exchange on a stream (a message each way, through the
// server's echo) allocates no more than each message's queue entry and a wake-up channel
// for a reader that parked: the queue keeps its array when it empties, and a message
// allocates one entry, not two.
func TestStreamExchangeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own: allocations are counted without -race")
	}
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			_, exchange := echoExchange(t, fb, payload(64, 7))
			exchange()
			// Each message: its entry (1) and, when its reader parked first, a wake-up channel
			// (at most 1): at most 4 for the two.
			if n := testing.AllocsPerRun(500, exchange); n > 4.5 {
				t.Errorf("%.2f allocations per exchange, want at most 4", n)
			} else {
				t.Logf("%.2f allocations per exchange", n)
			}
		})
	}
}

// TestStreamRecvInto: a waiting RecvInto gets a message that fits its buffer copied
// straight into it (no pool buffer held, no queue entry), one larger than its buffer in
// part with the rest returned, and its buffer is never written once it returned (here on
// its deadline, before the message came).
func TestStreamRecvInto(t *testing.T) {
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			e := newEnv(t, fb, streamEcho, Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st, err := e.conn.OpenStream(ctx, []byte("echo"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			offered := func() bool { st.mu.Lock(); defer st.mu.Unlock(); return st.into != nil }
			type result struct {
				n    int
				rest []byte
				err  error
			}
			recvInto := func(ctx context.Context, p []byte) <-chan result {
				ch := make(chan result, 1)
				go func() { n, rest, err := st.RecvInto(ctx, p); ch <- result{n, rest, err} }()
				return ch
			}

			// Its deadline passes while it waits: nothing arrived, and p stays as it was.
			early := bytes.Repeat([]byte{0xee}, 256)
			short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
			r := <-recvInto(short, early)
			stop()
			if !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("RecvInto past its deadline: %d, %v; want DeadlineExceeded", r.n, r.err)
			}

			// A message that fits: copied straight into p.
			msg := payload(100, 3)
			p := make([]byte, 256)
			got := recvInto(ctx, p)
			waitFor(t, "RecvInto to offer its buffer", offered)
			if err := st.Send(ctx, msg); err != nil {
				t.Fatal(err)
			}
			r = <-got
			if r.err != nil || r.n != len(msg) || len(r.rest) != 0 || !bytes.Equal(p[:r.n], msg) {
				t.Fatalf("RecvInto: %d bytes, rest %d, %v; want the %d bytes sent", r.n, len(r.rest), r.err, len(msg))
			}
			st.mu.Lock()
			held, queued := st.held, len(st.q)
			st.mu.Unlock()
			if held != nil || queued != 0 {
				t.Fatalf("the message was queued (held %v, %d queued), not copied into the waiting buffer", held != nil, queued)
			}
			if !bytes.Equal(early, bytes.Repeat([]byte{0xee}, 256)) {
				t.Fatal("the buffer of a RecvInto that had returned was written")
			}

			// A message larger than p: p's worth, and the rest.
			small := make([]byte, 10)
			got = recvInto(ctx, small)
			waitFor(t, "RecvInto to offer its buffer", offered)
			if err := st.Send(ctx, msg); err != nil {
				t.Fatal(err)
			}
			r = <-got
			if r.err != nil || r.n != len(small) || !bytes.Equal(append(small[:r.n:r.n], r.rest...), msg) {
				t.Fatalf("RecvInto of %d bytes into 10: %d, rest %d, %v", len(msg), r.n, len(r.rest), r.err)
			}
			if err := st.CloseSend(ctx); err != nil {
				t.Fatal(err)
			}
			if _, _, err := st.RecvInto(ctx, p); err != io.EOF {
				t.Fatalf("RecvInto at the end: %v, want io.EOF", err)
			}
		})
	}
}
