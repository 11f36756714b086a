package rpc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
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
