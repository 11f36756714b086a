package mwnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// TestHTTP serves net/http over mwnet and calls it with net/http's client.
func TestHTTP(t *testing.T) {
	for name, target := range targets(t) {
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			l, err := Listen(target)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, len(body))
			})}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(l) }()
			tr := &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return Dial(ctx, l.Addr().String())
			}}
			client := &http.Client{Transport: tr, Timeout: 20 * time.Second}
			for i, size := range []int{0, 10, 200 << 10} {
				resp, err := client.Post("http://mwnet/echo", "text/plain", strings.NewReader(strings.Repeat("x", size)))
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				got, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if want := fmt.Sprintf("POST /echo %d", size); err != nil || string(got) != want {
					t.Fatalf("request %d: %q, %v; want %q", i, got, err, want)
				}
			}
			tr.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				t.Fatal(err)
			}
		})
	}
}

// TestPlainCallRefused: a transport peer that sends a call, not a stream, gets
// Unimplemented; the listener goes on.
func TestPlainCallRefused(t *testing.T) {
	leakcheck.Check(t)
	l, c, s := pair(t, "127.0.0.1:0")
	dev, _ := soft.OpenTCP("plain-caller")
	defer dev.Close()
	tr, err := transport.New(dev, nil, transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc, err := tr.Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tc.Call(ctx, []byte("not a stream"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status() != transport.StatusUnimplemented {
		t.Fatalf("plain call: status %v, want Unimplemented", resp.Status())
	}
	resp.Release()
	go func() { _, _ = io.Copy(s, s) }()
	if _, err := c.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
}

// TestBacklog: a peer opening streams on one queue pair faster than they are accepted gets
// refusals beyond Backlog (counted), holds no more handlers than that, and the listener
// accepts again once the program takes what waits.
func TestBacklog(t *testing.T) {
	leakcheck.Check(t)
	l := listen(t, "127.0.0.1:0")
	const backlog = 8 // Backlog's behavior, with fewer dialers (each has a transport of its own)
	l.mu.Lock()
	l.backlog = backlog
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var conns []*Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	const extra = 3
	for range backlog + extra {
		c, err := Dial(ctx, l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Each dialer reads: the refused ones fail with ErrRefused; the others wait until the
	// end of the test closes them.
	refused := make(chan error, len(conns))
	for _, c := range conns {
		go func() {
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, ErrRefused) {
				refused <- err
			}
		}()
	}
	for range extra {
		select {
		case <-refused:
		case <-ctx.Done():
			t.Fatalf("%d streams refused (dialers saw %d ErrRefused) in 20 s; want %d", l.Refused(), len(refused), extra)
		}
	}
	if got := l.Refused(); got != extra {
		t.Fatalf("refused %d streams; want %d", got, extra)
	}
	for range backlog {
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
	}
	c, err := Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conns = append(conns, c)
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
}
