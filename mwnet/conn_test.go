package mwnet

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

// targets are the fabrics every test runs over.
func targets(t testing.TB) map[string]string {
	m := map[string]string{"tcp": "127.0.0.1:0"}
	if runtime.GOOS == "linux" {
		m["shm"] = "shm://" + filepath.Join(t.TempDir(), "mwnet.sock")
	} else {
		t.Log("shm fabric: Linux only, not run on " + runtime.GOOS)
	}
	return m
}

// listen listens on target for the test and closes the listener when the test ends.
func listen(t testing.TB, target string) *Listener {
	t.Helper()
	l, err := Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// pair listens on target and returns both ends of one connection.
func pair(t testing.TB, target string) (l *Listener, client, server net.Conn) {
	t.Helper()
	l = listen(t, target)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return l, c, s
}

func TestEchoSizes(t *testing.T) {
	for name, target := range targets(t) {
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			_, c, s := pair(t, target)
			go func() { _, _ = io.Copy(s, s); _ = s.(*Conn).CloseWrite() }()
			for _, n := range []int{1, 100, 64 << 10, 3<<20 + 7} {
				want := make([]byte, n)
				_, _ = rand.Read(want)
				errc := make(chan error, 1)
				go func() { _, err := c.Write(want); errc <- err }()
				got := make([]byte, n)
				if _, err := io.ReadFull(c, got); err != nil {
					t.Fatalf("%d bytes: read: %v", n, err)
				}
				if err := <-errc; err != nil {
					t.Fatalf("%d bytes: write: %v", n, err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%d bytes: echo differs", n)
				}
			}
			if err := c.(*Conn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Fatalf("read after both CloseWrites = %d, %v; want 0, io.EOF", n, err)
			}
			if _, err := c.Write([]byte("x")); !errors.Is(err, ErrWriteClosed) {
				t.Fatalf("write after CloseWrite: %v, want ErrWriteClosed", err)
			}
		})
	}
}

func TestDeadlines(t *testing.T) {
	leakcheck.Check(t)
	_, c, s := pair(t, "127.0.0.1:0")
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v, want a timeout", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("read past its deadline took %v", time.Since(start))
	}
	// A deadline moved into the past ends a Read already waiting.
	_ = c.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 1)); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	if err := <-errc; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("waiting read after SetReadDeadline(past): %v", err)
	}
	// Cleared, the conn works again.
	_ = c.SetDeadline(time.Time{})
	if _, err := s.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ok" {
		t.Fatalf("read after clearing the deadline: %q, %v", b, err)
	}
	// A Write blocked on a full window ends at its deadline, saying how much went.
	_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := c.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n >= 64<<20 {
		t.Fatalf("write into a window nobody reads: %d, %v; want a timeout", n, err)
	}
}

func TestCloseEndsBlockedCalls(t *testing.T) {
	leakcheck.Check(t)
	_, c, s := pair(t, "127.0.0.1:0")
	errc := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 1)); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	_ = c.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read ended by Close: %v, want net.ErrClosed", err)
	}
	// The server side sees the end: io.EOF or an error, never a hang.
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(s); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("server read after the client's Close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// TestPeerKilled cuts the dialer's queue pair mid-stream (as a killed process does): both
// sides' Reads and Writes end with errors, and nothing leaks.
func TestPeerKilled(t *testing.T) {
	for name, target := range targets(t) {
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			_, c, s := pair(t, target)
			serverErr := make(chan error, 1)
			go func() { _, err := io.Copy(io.Discard, s); serverErr <- err }()
			clientErr := make(chan error, 1)
			go func() {
				buf := make([]byte, 256<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						clientErr <- err
						return
					}
				}
			}()
			time.Sleep(50 * time.Millisecond)
			_ = c.(*Conn).qp.Close()
			select {
			case err := <-serverErr:
				if err == nil {
					t.Fatal("server read a clean end from a killed peer; want an error")
				}
			case <-time.After(20 * time.Second):
				t.Fatal("server read did not end after its peer died")
			}
			if err := <-clientErr; err == nil {
				t.Fatal("client write went on after its queue pair died")
			}
			if _, err := s.Write([]byte("x")); err == nil {
				t.Fatal("server write to a dead peer succeeded")
			}
		})
	}
}

// TestHostilePeer: garbage on a queue pair's bootstrap, and a call that is not a stream,
// fail only themselves; a good connection goes on.
func TestHostilePeer(t *testing.T) {
	leakcheck.Check(t)
	l, c, s := pair(t, "127.0.0.1:0")
	go func() { _, _ = io.Copy(s, s) }()
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 64<<10)
	_, _ = rand.Read(junk)
	_, _ = raw.Write(junk)
	_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.Copy(io.Discard, raw) // the listener drops it
	_ = raw.Close()
	if _, err := c.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 10)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "still here" {
		t.Fatalf("good connection after a hostile peer: %q, %v", b, err)
	}
}
