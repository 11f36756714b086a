package shm_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
	"github.com/mwrpc/mwrpc/transport/verbs/verbstest"
)

// pipe returns the two ends of a fresh shm connection (dialer first), set up through a
// listener at a socket of its own in t's temporary directory.
func pipe(t testing.TB, cfg shm.Config) (net.Conn, net.Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := shm.Listen(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ach := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			var b [0]byte
			_, err = c.Read(b[:]) // runs the setup
		}
		ach <- accepted{c, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := shm.Dial(ctx, path, cfg)
	x := <-ach
	if err != nil || x.err != nil {
		if a != nil {
			a.Close()
		}
		if x.c != nil {
			x.c.Close()
		}
		t.Fatalf("shm pipe: dial: %v, accept: %v", err, x.err)
	}
	return a, x.c
}

// TestConformance runs the provider-independent conformance suite on soft devices whose
// queue pairs are connected by the shm fabric. No case is divergent: every check is the
// soft NIC's, and the rings only carry its frames.
func TestConformance(t *testing.T) {
	var n atomic.Int64
	verbstest.Run(t, verbstest.Fixture{
		Name: "shm",
		Open: func(t testing.TB) verbs.Device {
			d, err := soft.OpenTCP(fmt.Sprintf("shm%d", n.Add(1)))
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		Pipe: func(t testing.TB) (net.Conn, net.Conn) { return pipe(t, shm.Config{RingSize: 64 << 10}) },
	})
}
