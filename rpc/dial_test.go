package rpc_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/rpc"
)

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// serveAt starts a server of the test service on addr after delay.
func serveAt(t *testing.T, addr string, delay time.Duration) {
	t.Helper()
	srv := rpc.NewServer(deviceServerOpts(t)...)
	srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(delay)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
}

// TestDialWaits: a client started before its server connects once the server is up.
func TestDialWaits(t *testing.T) {
	addr := freeAddr(t)
	serveAt(t, addr, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	copts := []rpc.DialOption{rpc.WithBackoff(20*time.Millisecond, 100*time.Millisecond)}
	if withDevices != nil {
		_, c := withDevices(t)
		copts = append(c, copts...)
	}
	c, err := rpc.Dial(ctx, addr, copts...)
	if err != nil {
		t.Fatalf("Dial before the server listened: %v", err)
	}
	defer c.Close()
	if time.Since(t0) < 250*time.Millisecond {
		t.Fatalf("Dial returned after %v, before the server listened", time.Since(t0))
	}
	if _, err := (svcClient{c}).Echo(ctx, &Msg{Text: "first"}); err != nil {
		t.Fatal(err)
	}
}

// TestDialGivesUp: with no server, Dial retries until its context ends, then says why,
// once. The context ends after the client logged its second failed attempt (a retry), not
// at a fixed time: on a loaded machine a deadline could pass before the first attempt
// failed, and then there is no why to say.
func TestDialGivesUp(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var failures atomic.Int32
	log := slog.New(recordHandler(func(r slog.Record) {
		if r.Message == "mwrpc: connecting failed; retrying" && failures.Add(1) == 2 {
			cancel()
		}
	}))
	_, err := rpc.Dial(ctx, addr, rpc.WithBackoff(20*time.Millisecond, 50*time.Millisecond), rpc.WithLogger(log))
	if ctx.Err() == nil {
		t.Fatalf("Dial with no server returned before its context ended (after %d failed attempts): %v", failures.Load(), err)
	}
	if !errors.Is(err, rpc.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") || strings.Count(err.Error(), addr) != 1 ||
		!strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Fatalf("Dial with no server: %v; want Unavailable saying connection refused, naming %s once, and that its context ended", err, addr)
	}
}

// recordHandler is a slog.Handler that gives every record, at every level, to fn.
type recordHandler func(slog.Record)

func (recordHandler) Enabled(context.Context, slog.Level) bool        { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h recordHandler) WithGroup(string) slog.Handler                 { return h }

// TestDialBadAddress: what no retry can dial is InvalidArgument, at once.
func TestDialBadAddress(t *testing.T) {
	for _, target := range []string{"", " , ", "localhost", "127.0.0.1:notaport", "::1:80", "127.0.0.1:7000,nohost"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		_, err := rpc.Dial(ctx, target)
		cancel()
		if !errors.Is(err, rpc.ErrInvalidArgument) || time.Since(t0) > time.Second {
			t.Errorf("Dial(%q): %v after %v; want InvalidArgument at once", target, err, time.Since(t0))
		}
	}
}

// TestNewClient: NewClient returns at once; calls fail fast while nothing is up, and a
// WaitForReady call waits for the server.
func TestNewClient(t *testing.T) {
	addr := freeAddr(t)
	c, err := rpc.NewClient(addr, rpc.WithBackoff(20*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := (svcClient{c}).Echo(context.Background(), &Msg{}); !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("a call with no server: %v, want Unavailable", err)
	}
	serveAt(t, addr, 100*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := new(Msg)
	if err := c.Invoke(ctx, "/test.Svc/Echo", &Msg{Text: "ready"}, out, rpc.WaitForReady()); err != nil || out.Text != "ready" {
		t.Fatalf("WaitForReady call once the server is up: %v", err)
	}
}

// Big is a request with a large field, encoded by msgpack (no size is known before
// encoding).
type Big struct {
	Name string
	Data []byte
}

// TestRequestOverLimit: a request over the maximum message size is refused before it is
// sent, with the limit named: raw bytes by their length, a msgpack struct as soon as its
// encoding passes the limit.
func TestRequestOverLimit(t *testing.T) {
	e := start(t, nil)
	huge := make([]byte, 200<<20) // over the default 64 MiB
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"raw bytes", func() error { _, err := e.svc.Bytes(context.Background(), huge); return err }},
		{"msgpack struct", func() error {
			return e.client.Invoke(context.Background(), "/test.Svc/Echo", &Big{Name: "x", Data: huge}, new(Msg))
		}},
	} {
		err := tc.call()
		if !errors.Is(err, rpc.ErrResourceExhausted) || !strings.Contains(err.Error(), "maximum message size of 67108864 bytes") {
			t.Errorf("%s: %v; want ResourceExhausted naming the 64 MiB limit", tc.name, err)
		}
	}
	if _, err := e.svc.Echo(context.Background(), &Msg{Text: "after"}); err != nil {
		t.Fatalf("the connection after refused requests: %v", err)
	}
}
