package rpc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// refusedClient returns a client of an address nothing listens on, once its first dial
// has failed.
func refusedClient(t *testing.T) (*rpc.Client, string) {
	t.Helper()
	addr := freeAddr(t)
	c, err := rpc.NewClient(addr, rpc.WithBackoff(10*time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A WaitForReady call that times out means the dials are failing.
	for ctx.Err() == nil {
		err := c.Invoke(ctx, "/test.Svc/Echo", &Msg{}, new(Msg))
		if strings.Contains(err.Error(), "refused") {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c, addr
}

// TestErrorsKeepTheirCause: a fail-fast call while no connection is up and a
// WaitForReady call that times out both say why the connections failed.
func TestErrorsKeepTheirCause(t *testing.T) {
	leakcheck.Check(t)
	c, addr := refusedClient(t)
	err := c.Invoke(context.Background(), "/test.Svc/Echo", &Msg{}, new(Msg))
	if !errors.Is(err, rpc.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) ||
		!strings.Contains(err.Error(), "no connection to "+addr+" is up") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("fail-fast call: %v; want Unavailable saying the connection was refused", err)
	}

	t.Logf("fail-fast: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = c.Invoke(ctx, "/test.Svc/Echo", &Msg{}, new(Msg), rpc.WaitForReady())
	t.Logf("WaitForReady: %v", err)
	if rpc.CodeOf(err) != rpc.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) ||
		!strings.Contains(err.Error(), "while waiting for a connection to "+addr) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("WaitForReady call that timed out: %v; want DeadlineExceeded saying the connection was refused", err)
	}
}

// notMwrpc serves each connection by writing answer and closing it.
func notMwrpc(t *testing.T, answer []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = nc.Write(answer)
			_ = nc.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// TestDialNotMwrpc: Dial to a server that is not mwrpc stops at its first answer, saying
// what answered, instead of retrying until its context ends.
func TestDialNotMwrpc(t *testing.T) {
	leakcheck.Check(t)
	cases := []struct {
		name   string
		answer []byte
		says   string
	}{
		// What grpc-go's server writes first: a SETTINGS frame (then it closes on our bytes).
		{"gRPC", []byte{0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0x40, 0}, "HTTP/2 server's SETTINGS"},
		{"HTTP/1", []byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"), "HTTP/1 server"},
		{"other", []byte("SSH-2.0-OpenSSH_9.6\r\n"), `"SSH-2.0-OpenSSH_`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := notMwrpc(t, tc.answer)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			t0 := time.Now()
			c, err := rpc.Dial(ctx, addr)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			t.Logf("Dial: %v", err)
			if !errors.Is(err, transport.ErrNotMwrpcPeer) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), addr) {
				t.Errorf("Dial: %v; want ErrNotMwrpcPeer naming %s and saying %q", err, addr, tc.says)
			}
			if d := time.Since(t0); d > 5*time.Second {
				t.Errorf("Dial took %v: it retried a peer whose answer proved it is not mwrpc", d)
			}
		})
	}
}

// TestEndedContextNotSent: a call or stream whose context already ended fails with the
// context's status at once, whatever a fast server would have answered (it is not sent).
func TestEndedContextNotSent(t *testing.T) {
	e := start(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	served := e.srv.Stats().Served
	for i := range 20 {
		if _, err := e.svc.Echo(ctx, &Msg{Text: "late"}); !errors.Is(err, rpc.ErrDeadlineExceeded) {
			t.Fatalf("call %d with an ended context: %v", i, err)
		}
	}
	if _, err := e.client.NewStream(ctx, "/test.Streams/Count", &Msg{N: 1}); !errors.Is(err, rpc.ErrDeadlineExceeded) {
		t.Errorf("stream with an ended context: %v", err)
	}
	if n := e.srv.Stats().Served - served; n != 0 {
		t.Errorf("the server served %d requests whose context had ended", n)
	}
}
