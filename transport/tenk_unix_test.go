//go:build unix

package transport

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

const (
	tenKHosts   = 10   // loopback addresses the client process connects from
	tenKPerHost = 1000 // connections from each
	tenKConns   = tenKHosts * tenKPerHost
	tenKClient  = "MWRPC_TENK_CLIENT"
)

func init() { childRoles[tenKClient] = tenKClientRole }

// TestTenThousandConns: a server with the default Config holds 10,000 connections on the
// soft TCP fabric from a client process of its own, 1,000 from each of ten loopback
// addresses (a sidecar or a NAT brings that many from one), its per-host rate limit on;
// each makes a call; none is refused; then all close and nothing leaks. It logs what an
// idle connection costs the server. Loopback only; each process needs a file limit of
// about 10,500, raised where the process may.
func TestTenThousandConns(t *testing.T) {
	switch {
	case testing.Short():
		t.Skip("10,000 connections take about half a minute: skipped with -short")
	case raceEnabled:
		t.Skip("10,000 connections under the race detector need several GiB: run without -race")
	}
	if err := raiseFileLimit(tenKConns + 512); err != nil {
		t.Skipf("cannot hold 10,000 connections in one process: %v", err)
	}
	if err := dialFrom(net.IPv4(127, 0, 0, tenKHosts)); err != nil {
		t.Skipf("loopback addresses beyond 127.0.0.1 are not usable here (%v): the test brings 1,000 connections from each of ten", err)
	}
	base := runtime.NumGoroutine()
	sdev, _ := soft.OpenTCP("server")
	server, err := New(sdev, echo, Config{}) // the defaults under test
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- server.Serve(ln) }()
	heap0 := heapInUse()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), tenKClient+"="+ln.Addr().String())
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // on every path, so that a failure leaves nothing behind
		stdin.Close()
		waitChild(t, cmd)
		ln.Close()
		if err := server.Close(); err != nil {
			t.Errorf("server close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		sdev.Close()
		leakcheck.Wait(t, base)
	})
	said := readLine(stdout, 4*time.Minute)
	if !strings.HasPrefix(said, "ready") {
		t.Fatalf("the client process said %q, want ready", said)
	}
	st := server.Stats()
	heap1 := heapInUse()
	cqe := 0
	server.mu.Lock()
	for _, p := range server.pollers {
		cqe += p.cq.Cap()
	}
	server.mu.Unlock()
	t.Logf("the client process: %s; the server: %d connections, an idle one %.1f KiB of Go heap (its %d-entry CQ included)",
		said, st.Conns, float64(heap1-heap0)/tenKConns/1024, cqe)
	if st.Conns != tenKConns || st.Refused > 0 {
		t.Errorf("the server holds %d connections and refused %d, want %d and none", st.Conns, st.Refused, tenKConns)
	}
	stdin.Close()
	closing := time.Now()
	// Counted under the transport's lock, not with Stats, which visits every connection's
	// windows: every 10 ms over 10,000 connections, that was a quarter of the test's CPU.
	held := func() int {
		server.mu.Lock()
		defer server.mu.Unlock()
		return len(server.conns)
	}
	for deadline := time.Now().Add(time.Minute); held() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server still has %d connections a minute after the client closed them", held())
		}
	}
	t.Logf("the server let go of the %d connections in %v", tenKConns, time.Since(closing).Round(time.Millisecond))
}

// tenKClientRole is the client process: it opens the connections, makes a call on each,
// says "ready" with what it took, and closes them all when its stdin ends.
func tenKClientRole(addr string) int {
	if err := raiseFileLimit(tenKConns + 512); err != nil {
		fmt.Println(err)
		return 1
	}
	dev, _ := soft.OpenTCP("client")
	defer dev.Close()
	client, err := New(dev, nil, Config{MaxConns: tenKConns})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	conns, err := dialHosts(ctx, client, addr, tenKHosts, tenKPerHost)
	setup := time.Since(start)
	if err == nil {
		err = callEach(ctx, conns)
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Printf("ready: %d connections set up in %v, one call on each\n", len(conns), setup.Round(time.Millisecond))
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	return 0
}

func callEach(ctx context.Context, conns []*Conn) error {
	for i, c := range conns {
		resp, err := c.Call(ctx, []byte("one of ten thousand"))
		if err != nil {
			return fmt.Errorf("call on connection %d: %w", i, err)
		}
		resp.Release()
	}
	return nil
}

// dialHosts opens perHost connections from each of the loopback addresses 127.0.0.1 to
// 127.0.0.hosts, eight at a time. On an error it closes what it opened.
func dialHosts(ctx context.Context, client *Transport, addr string, hosts, perHost int) ([]*Conn, error) {
	conns := make([]*Conn, hosts*perHost)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(conns); i += 8 {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%hosts))}}
				nc, err := d.DialContext(ctx, "tcp", addr)
				if err == nil {
					conns[i], err = client.NewConn(ctx, nc)
				}
				if err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	return conns, nil
}

// readLine returns the first line r gives within d, or what went wrong.
func readLine(r io.Reader, d time.Duration) string {
	line := make(chan string, 1)
	go func() {
		s, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			s += fmt.Sprintf(" (%v)", err)
		}
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		return s
	case <-time.After(d):
		return fmt.Sprintf("nothing in %v", d)
	}
}

// waitChild waits for the child process to exit once its stdin is closed, killing it
// after a minute.
func waitChild(t *testing.T, cmd *exec.Cmd) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the client process: %v", err)
		}
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("the client process did not exit a minute after its stdin closed: killed")
	}
}

// dialFrom checks that a TCP connection can be made from ip over loopback.
func dialFrom(ip net.IP) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: time.Second}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	return c.Close()
}

// raiseFileLimit raises RLIMIT_NOFILE to at least n, the hard limit too where the process
// may (root with CAP_SYS_RESOURCE).
func raiseFileLimit(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	if uint64(lim.Cur) >= n {
		return nil
	}
	want := lim
	setRlim(&want.Cur, n)
	if uint64(lim.Max) < n {
		setRlim(&want.Max, n)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("the file limit is %d (hard %d) and cannot be raised to %d: %w", lim.Cur, lim.Max, n, err)
	}
	return nil
}

// setRlim stores n in an rlimit field: an int64 on FreeBSD and DragonFly, a uint64 elsewhere.
func setRlim[T int64 | uint64](f *T, n uint64) { *f = T(n) }

// BenchmarkConnChurn is a connection set up and torn down (Dial, then Close until the
// server let go of it) while held others stay open to the same server, both sides in
// this process on the soft TCP fabric: what a server's and a client's poller tables cost
// as connections come and go among thousands. 9,500 is as near 10,000 as a file limit of
// 20,000 (common in containers, where even root cannot raise it) lets one process hold
// both sides' sockets.
//
//	go test -run '^$' -bench ConnChurn -benchmem -benchtime 200x ./transport/
func BenchmarkConnChurn(b *testing.B) {
	for _, held := range []int{1000, 9500} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			if err := raiseFileLimit(uint64(2*held + 512)); err != nil {
				b.Skipf("cannot hold %d connections (two sockets each) in one process: %v", held, err)
			}
			cfg := Config{ConnRatePerHost: 1e9, MaxConnsPerHost: 1 << 20, MaxConns: 2*held + 64}
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			e := newEnv(b, fabrics[1], echo, cfg)
			ctx := context.Background()
			conns := make([]*Conn, 0, held)
			for range held - 1 { // newEnv's is one
				c, err := e.client.Dial(ctx, e.addr)
				if err != nil {
					b.Fatalf("holding %d connections: %v", held, err)
				}
				conns = append(conns, c)
			}
			b.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
				waitServerConns(b, e.server, 1)
			})
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				c, err := e.client.Dial(ctx, e.addr)
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
				waitServerConns(b, e.server, held)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
		})
	}
}

// waitServerConns waits until the server holds n connections at most.
func waitServerConns(b *testing.B, s *Transport, n int) {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Microsecond) {
		s.mu.Lock()
		got := len(s.conns)
		s.mu.Unlock()
		if got <= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the server still holds %d connections, want %d", got, n)
		}
	}
}
