package rpc_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/internal/parcopy"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
)

// The peer of TestSHMPeerKilled is this test binary run again with envKillPeer set to
// "server:PATH" (serve the test services at shm://PATH), "client:PATH" (call them there
// without end) or "client-lanes3:PATH" (the same over three pinned lanes). It says "ready"
// on stdout once it serves, or once its first call is answered, and runs until it is
// killed.
const envKillPeer = "MWRPC_SHM_KILL_PEER"

func init() { peerMain = runKillPeer }

func runKillPeer() bool {
	role, path, ok := strings.Cut(os.Getenv(envKillPeer), ":")
	if !ok {
		return false
	}
	var err error
	switch role {
	case "server":
		srv := rpc.NewServer()
		srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
		srv.RegisterService(&streamsDesc, &streamsImpl{ended: make(chan error, 16)})
		go func() {
			for !exists(path) {
				time.Sleep(time.Millisecond)
			}
			fmt.Println("ready")
		}()
		err = srv.ListenAndServe("shm://" + path)
	case "client":
		err = callForever(path)
	case "client-lanes3":
		err = callForever(path, rpc.WithLanes(3))
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	fmt.Fprintln(os.Stderr, "kill peer:", err)
	os.Exit(1)
	return true
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// load is what the calls in flight are when a peer dies: callers of 16 MiB echoes (whose
// bytes are in the middle of a placed copy between the two processes' pool memory, or of
// a ring write for the first call into a slab not yet shared), of calls the server holds,
// and a stream the server stalls.
func load(ctx context.Context, c *rpc.Client, first func()) []error {
	var wg sync.WaitGroup
	var once sync.Once
	errs := make([]error, 7)
	big := make([]byte, 16<<20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && errs[i] == nil {
				var err error
				switch {
				case i < 4:
					_, err = svcClient{c}.Bytes(ctx, big)
				case i < 6:
					_, err = svcClient{c}.Sleep(ctx, &Msg{N: int64(100 * time.Millisecond)})
				default:
					for _, e := range (streamsClient{c}).Count(ctx, &Msg{N: 10, Blob: big[:1<<20], Text: "stall"}) {
						if e != nil {
							err = e
							break
						}
						once.Do(first)
					}
				}
				if err == nil {
					once.Do(first)
				}
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errs
}

func callForever(path string, opts ...rpc.DialOption) error {
	ctx := context.Background()
	c, err := rpc.Dial(ctx, "shm://"+path, opts...)
	if err != nil {
		return err
	}
	errs := load(ctx, c, func() { fmt.Println("ready") })
	return fmt.Errorf("a call failed while the server lives: %v", errs)
}

// startPeer starts the peer process in role and waits for its "ready".
func startPeer(t *testing.T, role, path string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envKillPeer+"="+role+":"+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("peer said %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("peer %s: %v", role, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("peer %s not ready after 20s", role)
	}
	return cmd
}

// kill kills the peer with SIGKILL and reaps it (closing its stdout pipe here).
func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // "signal: killed"
}

// TestSHMPeerKilled: a peer process killed (SIGKILL) with calls, 16 MiB messages in the
// middle of a copy and a stream in flight over the shm fabric leaves the survivor
// with every call ended by a status, no window bound, no pooled buffer held, no
// descriptor (ring, doorbell, socket) open and no goroutine left behind. The survivor
// splits its large copies over helpers (as a machine of eight or more Ps would), so a peer
// that dies in the middle of one finds helpers copying from or into its memory. With three
// pinned lanes the survivor's readers are more than may poll at once on 2 cores: some wait
// watched by another when the peer dies.
func TestSHMPeerKilled(t *testing.T) {
	defer parcopy.SetHelpers(3)()
	t.Run("server", func(t *testing.T) { serverKilled(t) })
	t.Run("server/lanes=3", func(t *testing.T) { serverKilled(t, rpc.WithLanes(3)) })
	t.Run("client", func(t *testing.T) { clientKilled(t, "client") })
	t.Run("client/lanes=3", func(t *testing.T) { clientKilled(t, "client-lanes3") })
}

// serverKilled is TestSHMPeerKilled with the server the peer that dies: the survivor is a
// Client dialed with opts.
func serverKilled(t *testing.T, opts ...rpc.DialOption) {
	leakcheck.Check(t)
	held := leakcheck.CountHeld(t)
	path := filepath.Join(t.TempDir(), "srv.sock")
	cmd := startPeer(t, "server", path)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, "shm://"+path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan []error, 1)
	go func() { done <- load(ctx, c, func() { close(started) }) }()
	<-started
	time.Sleep(50 * time.Millisecond) // 16 MiB messages are on their way
	kill(t, cmd)
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(8 * time.Second):
		t.Fatal("calls still in flight 8s after the server was killed")
	}
	for i, err := range errs {
		if code := rpc.CodeOf(err); code != rpc.Unavailable {
			t.Errorf("caller %d ended with %v, want Unavailable", i, err)
		}
	}
	waitStats(t, "client", c.Stats)
	c.Close()
	leakcheck.WaitHeld(t, held)
}

// clientKilled is TestSHMPeerKilled with the client the peer that dies, started in role:
// the survivor is a Server.
func clientKilled(t *testing.T, role string) {
	leakcheck.Check(t)
	held := leakcheck.CountHeld(t)
	path := filepath.Join(t.TempDir(), "srv.sock")
	srv := rpc.NewServer()
	srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
	srv.RegisterService(&streamsDesc, &streamsImpl{ended: make(chan error, 16)})
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe("shm://" + path) }()
	for deadline := time.Now().Add(5 * time.Second); !exists(path); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server does not listen")
		}
	}
	// The socket is bound before Serve sets the transport up: the baseline is taken once
	// it is (under load it was taken before, without the shared receive slots' 256
	// buffers, which the comparison below then counted as held).
	var base transport.Stats
	for deadline := time.Now().Add(5 * time.Second); base.HandlersCap == 0; base = srv.Stats() {
		if time.Now().After(deadline) {
			t.Fatal("the server's transport is not set up 5 s after it listens")
		}
		time.Sleep(time.Millisecond)
	}
	cmd := startPeer(t, role, path)
	time.Sleep(50 * time.Millisecond) // 16 MiB messages are on their way
	kill(t, cmd)
	waitStats(t, "server", srv.Stats)
	if st := srv.Stats(); buffersInUse(st.Pool.Classes) > buffersInUse(base.Pool.Classes) {
		t.Errorf("the server holds %d pooled buffers, %d before the client came", buffersInUse(st.Pool.Classes), buffersInUse(base.Pool.Classes))
	}
	srv.Stop()
	if err := <-served; err != nil {
		t.Errorf("ListenAndServe: %v", err)
	}
	leakcheck.WaitHeld(t, held)
}

// waitStats waits until a side has no connection, no window exposed and no handler
// running, as it must once its peer is gone.
func waitStats(t *testing.T, side string, stats func() transport.Stats) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := stats()
		if st.Conns == 0 && st.WindowsExposed == 0 && st.Handlers == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s 10s after its peer was killed: %d connections, %d windows exposed, %d handlers running", side, st.Conns, st.WindowsExposed, st.Handlers)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// buffersInUse counts the pooled buffers handed out.
func buffersInUse(classes []pool.ClassStats) int {
	n := 0
	for _, c := range classes {
		n += c.InUse
	}
	return n
}
