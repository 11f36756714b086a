package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// TestSHM runs a representative subset of this package's tests with the server listening
// on an shm target (shm:///<tmp>/rpc.sock, the same-host shared-memory fabric) and the
// client dialing it.
func TestSHM(t *testing.T) {
	dir := t.TempDir()
	tcpListen, tcpTarget := listen, target
	listen = func(addr string) (net.Listener, error) {
		path, ok := shm.ParseTarget(addr)
		if !ok {
			f, err := os.CreateTemp(dir, "rpc-*.sock")
			if err != nil {
				return nil, err
			}
			path = f.Name()
			f.Close()
			os.Remove(path) // a fresh name for the socket
		}
		return shm.Listen(path, shm.Config{})
	}
	target = func(ln net.Listener) string { return ln.Addr().String() }
	defer func() { listen, target = tcpListen, tcpTarget }()
	runFabricSuite(t,
		fabricTest{"GracefulStop", TestGracefulStop},
		fabricTest{"StreamBuffer", TestStreamBuffer},
		fabricTest{"ClientStreamBuffer", TestClientStreamBuffer},
		fabricTest{"CopiesInPieces", TestCopiesInPieces},
	)
}

// TestSHMListenAndServe: ListenAndServe and Dial take shm:///path targets; a target with a
// host or without a path is InvalidArgument; the socket is gone once the server stops.
func TestSHMListenAndServe(t *testing.T) {
	leakcheck.Check(t)
	path := filepath.Join(t.TempDir(), "kv.sock")
	srv := rpc.NewServer()
	srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe("shm://" + path) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, "shm://"+path)
	if err != nil {
		t.Fatal(err)
	}
	out, err := svcClient{c}.Echo(ctx, &Msg{Text: "over shm"})
	if err != nil || out.Text != "over shm" {
		t.Fatalf("echo: %v %v", out, err)
	}
	c.Close()
	srv.Stop()
	if err := <-served; err != nil {
		t.Fatalf("ListenAndServe: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the socket is left after Stop: %v", err)
	}
	for _, bad := range []string{"shm://host/x.sock", "shm://"} {
		if _, err := rpc.NewClient(bad); rpc.CodeOf(err) != rpc.InvalidArgument {
			t.Errorf("NewClient(%q): %v, want InvalidArgument", bad, err)
		}
	}
}

// TestSHMLanes: over the shm fabric an adaptive client's calls in flight open lanes up to
// half of GOMAXPROCS (each lane more is a polling reader more on each side; TCP's cap is
// all of it, TestLanesAdaptive): one lane on 3 Ps however many small calls are in flight,
// three on 6; calls that carry megabytes either way (raw, or encoded requests answered
// with a few bytes) open more, up to GOMAXPROCS, so that their copies run side by side;
// WithLanes still pins any count.
func TestSHMLanes(t *testing.T) {
	leakcheck.Check(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	path := filepath.Join(t.TempDir(), "lanes.sock")
	srv := rpc.NewServer()
	srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe("shm://" + path) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("ListenAndServe: %v", err)
		}
	}()
	// small: 24 callers, 8 a lane at 3; large: 8 callers of 1 MiB, 16 MiB in flight both ways.
	small := func(t *testing.T, c *rpc.Client) { callMany(t, svcClient{c}, 24, 20, time.Millisecond) }
	large := func(t *testing.T, c *rpc.Client) {
		b := make([]byte, 1<<20) // only read by the calls
		eightCallers(t, func() error {
			_, err := svcClient{c}.Bytes(context.Background(), b)
			return err
		})
	}
	// uploads: 8 callers of 1 MiB msgpack-encoded requests answered with a small status,
	// counted by what the requests took once encoded.
	uploads := func(t *testing.T, c *rpc.Client) {
		m := &Msg{N: int64(rpc.FailedPrecondition), Blob: make([]byte, 1<<20)}
		eightCallers(t, func() error {
			if _, err := (svcClient{c}).Fail(context.Background(), m); rpc.CodeOf(err) != rpc.FailedPrecondition {
				return fmt.Errorf("upload: %v, want FailedPrecondition", err)
			}
			return nil
		})
	}
	for _, tc := range []struct {
		name  string
		procs int // GOMAXPROCS when the client dials: the caps follow it
		opts  []rpc.DialOption
		load  func(*testing.T, *rpc.Client)
		lanes int
	}{
		{"adaptive, small calls, 3 Ps", 3, nil, small, 1},
		{"adaptive, small calls, 6 Ps", 6, nil, small, 3},
		{"adaptive, large calls", 3, nil, large, 3},
		{"adaptive, large encoded requests", 3, nil, uploads, 3},
		{"pinned", 3, []rpc.DialOption{rpc.WithLanes(2)}, small, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(tc.procs)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := rpc.Dial(ctx, "shm://"+path, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tc.load(t, c)
			if tc.lanes > 1 {
				waitLanes(t, c, tc.lanes)
			}
			if got := c.Lanes(); !slices.Equal(got, []int{tc.lanes}) {
				t.Fatalf("after the calls: %v lanes, want [%d]", got, tc.lanes)
			}
		})
	}
}

// eightCallers runs call 20 times on each of 8 goroutines at once; a caller stops at its
// first error, which fails the test.
func eightCallers(t *testing.T, call func() error) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if err := call(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestServerListen: Listen opens what ListenAndServe would serve, and its Addr is what a
// client dials: a TCP port chosen by the kernel, an shm:/// target as given.
func TestServerListen(t *testing.T) {
	leakcheck.Check(t)
	for _, address := range []string{"127.0.0.1:0", "shm://" + filepath.Join(t.TempDir(), "listen.sock")} {
		srv := rpc.NewServer()
		srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
		ln, err := srv.Listen(address)
		if err != nil {
			t.Fatalf("Listen(%q): %v", address, err)
		}
		target := ln.Addr().String()
		onSHM := strings.HasPrefix(address, "shm://")
		if onSHM && target != address || !onSHM && strings.HasSuffix(target, ":0") {
			t.Errorf("Listen(%q): Addr %q, want the shm target itself, or the TCP port the kernel chose", address, target)
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := rpc.Dial(ctx, target)
		if err == nil {
			_, err = svcClient{c}.Echo(ctx, &Msg{Text: "listened"})
			c.Close()
		}
		cancel()
		if err != nil {
			t.Errorf("%s: %v", target, err)
		}
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
}
