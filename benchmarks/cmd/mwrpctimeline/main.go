// Command mwrpctimeline finds where the time of one call goes across two processes: it
// timestamps each step of one 64 B and one 64 KiB echo call at concurrency 1, client and
// server in separate processes over the soft TCP fabric on loopback (each syscall on the
// soft NIC's socket, each goroutine hand-off, each copy and each wire trip), joins both
// processes' marks on CLOCK_MONOTONIC, which every process of a machine shares, and
// prints the median of each step over the calls. It does the same for a raw TCP
// ping-pong of the same sizes, the floor: the table shows which steps raw TCP pays too.
//
// The marks are internal/probe's, compiled in only with the build tag mwrpcprobe (without
// it the probe points in transport/, transport/verbs/soft/ and rpc/ are empty functions
// and this command measures latencies only):
//
//	make timeline
//	cd benchmarks && go run -tags mwrpcprobe ./cmd/mwrpctimeline            # ~20 s
//	cd benchmarks && go run -tags mwrpcprobe ./cmd/mwrpctimeline -calls 5000 -systems mwrpc -sizes 64
//
// Systems (-systems): mwrpc (the harness's mwrpc-tcp: rpc.Dial and rpc.NewServer over
// the soft TCP fabric, default configuration), mwrpc-tuned (the harness's mwrpc-tuned: 66
// KiB slots, so 64 KiB travels inside the SEND; shared receives; inline handlers),
// mwrpc-lent (the harness's mwrpc-lent: each request built in rpc.Client.Buffer, each
// response lent with rpc.WithLentResponses), mwrpc-shm and mwrpc-shm-lent (mwrpc and
// mwrpc-lent over the shm fabric, at a Unix socket in the temporary directory), raw (a
// length-prefixed echo over TCP). For each system and size the server is this binary
// again (`-serve SYSTEM`), which prints its address, serves until its stdin ends, then
// writes its marks to a file the client named. Outputs, in -out (results/timeline):
// timeline.md (the tables, also printed), timeline.json and timeline.png (a stacked bar
// per system and size: where the median call's time goes).
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/echo"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-serve" {
		if err := serve(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "mwrpctimeline server:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mwrpctimeline:", err)
		os.Exit(1)
	}
}

func run() error {
	calls := flag.Int("calls", 20000, "measured calls per system and size")
	warm := flag.Int("warmup", 2000, "unmeasured calls before them")
	systems := flag.String("systems", "mwrpc,raw,mwrpc-tuned", "systems: mwrpc, mwrpc-tuned, mwrpc-lent, mwrpc-shm, mwrpc-shm-lent, raw")
	sizes := flag.String("sizes", "64,65536", "payload sizes in bytes")
	out := flag.String("out", "results/timeline", "output directory")
	flag.Parse()
	if !probe.Enabled {
		fmt.Fprintln(os.Stderr, "mwrpctimeline: built without -tags mwrpcprobe: latencies only, no steps")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	var runs []*phase
	for _, sys := range strings.Split(*systems, ",") {
		for _, s := range strings.Split(*sizes, ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("size %q: %w", s, err)
			}
			ph, err := measure(sys, n, *warm, *calls, *out)
			if err != nil {
				return fmt.Errorf("%s %d B: %w", sys, n, err)
			}
			runs = append(runs, ph)
			fmt.Fprintf(os.Stderr, "%s %s: p50 %.1f µs over %d calls\n", sys, sizeName(n), ph.P50us, len(ph.lat))
		}
	}
	return report(runs, *out, strings.Join(os.Args[1:], " "))
}

// phase is one system and size: its calls' latencies and both sides' marks.
type phase struct {
	System string
	Size   int
	P50us  float64
	lat    []time.Duration
	client []probe.Record
	server []probe.Record
	lost   uint64
	an     *analysis
}

// client is one system's caller.
type client interface {
	call() error
	close() error
}

func measure(sys string, size, warm, calls int, dir string) (*phase, error) {
	dump := filepath.Join(dir, "server-"+sys+"-"+strconv.Itoa(size)+".marks")
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-serve", sys, "-dump", dump)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = sysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("server address: %w", err)
	}
	addr = strings.TrimSpace(addr)
	var c client
	switch sys {
	case "raw":
		c, err = dialRaw(addr, size)
	default:
		c, err = dialMwrpc(sys, addr, size)
	}
	if err != nil {
		return nil, err
	}
	for range warm {
		if err := c.call(); err != nil {
			return nil, err
		}
	}
	probe.Reset()
	ph := &phase{System: sys, Size: size, lat: make([]time.Duration, calls)}
	for i := range calls {
		t0 := time.Now()
		probe.Mark(probe.CallBegin)
		err := c.call()
		probe.Mark(probe.CallEnd)
		ph.lat[i] = time.Since(t0)
		if err != nil {
			return nil, err
		}
	}
	time.Sleep(5 * time.Millisecond) // the server's last marks (its write returning)
	ph.client, ph.lost = probe.Records()
	if err := c.close(); err != nil {
		return nil, err
	}
	_ = stdin.Close() // the server writes its marks and exits
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if ph.server, err = readMarks(dump); err != nil {
		return nil, err
	}
	_ = os.Remove(dump)
	ph.P50us = float64(percentile(ph.lat, 0.5)) / 1e3
	return ph, nil
}

// serve is the server process: `mwrpctimeline -serve SYSTEM -dump FILE`.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	dump := fs.String("dump", "", "file for the marks")
	if len(args) == 0 {
		return errors.New("no system")
	}
	sys := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr() // what the client is told, whichever listener serves it
	var stop func() error
	switch sys {
	case "raw":
		stop = serveRaw(ln)
	case "mwrpc", "mwrpc-tuned", "mwrpc-lent", "mwrpc-shm", "mwrpc-shm-lent":
		dev, err := soft.OpenTCP("timeline-server")
		if err != nil {
			return err
		}
		if overSHM(sys) {
			path := shmSocket(ln.Addr().String())
			_ = os.Remove(path)
			sln, err := shm.Listen(path, transport.Config{}.SHM())
			if err != nil {
				return err
			}
			defer ln.Close()
			ln = sln
		}
		opts := []rpc.ServerOption{rpc.WithDevice(dev)}
		if sys == "mwrpc-tuned" {
			cfg := tuned
			cfg.SharedReceives, cfg.InlineHandlers = 512, true
			opts = append(opts, rpc.WithTransport(cfg))
		}
		srv := rpc.NewServer(opts...)
		echo.RegisterBench(srv, markedEcho{})
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		stop = func() error { srv.Stop(); return errors.Join(<-served, dev.Close()) }
	default:
		return fmt.Errorf("unknown system %q", sys)
	}
	fmt.Println(addr)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the client is done
	recs, _ := probe.Records()
	err = writeMarks(*dump, recs)
	return errors.Join(err, stop())
}

// tuned is the harness's mwrpc-tuned configuration (benchmarks/internal/bench): 64 KiB and
// the rpc envelope fit a receive slot, so they go inside the SEND.
var tuned = transport.Config{SlotSize: 66 << 10, EagerThreshold: 66<<10 - 32}

// markedEcho is echo.Server with a mark where the handler's body runs.
type markedEcho struct{}

func (markedEcho) Echo(_ context.Context, data []byte) ([]byte, error) {
	probe.Mark(probe.Echo)
	return data, nil
}

type mwrpcClient struct {
	c    *rpc.Client
	stub *echo.BenchClient
	dev  *soft.Device
	req  []byte
	lent bool // mwrpc-lent: requests in Client.Buffer's memory, responses lent (WithLentResponses)
}

func dialMwrpc(sys, addr string, size int) (client, error) {
	dev, err := soft.OpenTCP("timeline-client")
	if err != nil {
		return nil, err
	}
	opts := []rpc.DialOption{rpc.WithDevice(dev)}
	switch sys {
	case "mwrpc-tuned":
		opts = append(opts, rpc.WithTransport(tuned))
	case "mwrpc-lent", "mwrpc-shm-lent":
		opts = append(opts, rpc.WithLentResponses())
	}
	target := addr
	if overSHM(sys) {
		target = shm.Scheme + shmSocket(addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, target, opts...)
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	return &mwrpcClient{c: c, stub: echo.NewBenchClient(c), dev: dev, req: make([]byte, size), lent: strings.HasSuffix(sys, "-lent")}, nil
}

// overSHM reports whether sys runs over the shm fabric.
func overSHM(sys string) bool { return strings.HasPrefix(sys, "mwrpc-shm") }

// shmSocket is the Unix socket of the shm server whose TCP listener (kept, so that the
// client learns where to go the same way for every system) is at addr.
func shmSocket(addr string) string {
	return filepath.Join(os.TempDir(), "mwrpctimeline-"+strings.NewReplacer(":", "-", ".", "-").Replace(addr)+".sock")
}

func (m *mwrpcClient) call() error {
	req := m.req
	if m.lent { // built in registered memory (not filled again: raw TCP's bytes are not either)
		var err error
		if req, err = m.c.Buffer(context.Background(), len(m.req)); err != nil {
			return err
		}
	}
	out, err := m.stub.Echo(context.Background(), req)
	if err == nil && len(out) != len(m.req) {
		err = fmt.Errorf("echo of %d bytes returned %d", len(m.req), len(out))
	}
	if err == nil && m.lent {
		err = m.c.Release(out)
	}
	return err
}

func (m *mwrpcClient) close() error { return errors.Join(m.c.Close(), m.dev.Close()) }

// markedConn marks each read(2) and write(2) on a TCP connection, as the soft NIC's link
// does on its own.
type markedConn struct{ net.Conn }

func (c markedConn) Read(b []byte) (int, error) {
	probe.Mark(probe.Read)
	n, err := c.Conn.Read(b)
	probe.MarkN(probe.ReadDone, uint32(n))
	return n, err
}

func (c markedConn) Write(b []byte) (int, error) {
	probe.MarkN(probe.Write, uint32(len(b)))
	n, err := c.Conn.Write(b)
	probe.Mark(probe.WriteDone)
	return n, err
}

// The raw TCP floor: the harness's rawtcp, a 4-byte length and the payload each way.
type rawClient struct {
	c       net.Conn
	msg, in []byte
}

func dialRaw(addr string, size int) (client, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	msg := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+size), uint32(size))
	msg = append(msg, make([]byte, size)...)
	return &rawClient{c: markedConn{c}, msg: msg, in: make([]byte, len(msg))}, nil
}

func (r *rawClient) call() error {
	if _, err := r.c.Write(r.msg); err != nil {
		return err
	}
	_, err := io.ReadFull(r.c, r.in)
	return err
}

func (r *rawClient) close() error { return r.c.Close() }

func serveRaw(ln net.Listener) func() error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		c := markedConn{nc}
		defer c.Close()
		buf := make([]byte, 4+64)
		for {
			if _, err := io.ReadFull(c, buf[:4]); err != nil {
				return
			}
			n := int(binary.LittleEndian.Uint32(buf))
			if 4+n > len(buf) {
				buf = append(buf[:4], make([]byte, n)...)
			}
			if _, err := io.ReadFull(c, buf[4:4+n]); err != nil {
				return
			}
			probe.Mark(probe.Echo)
			if _, err := c.Write(buf[:4+n]); err != nil {
				return
			}
		}
	}()
	return func() error { err := ln.Close(); <-done; return err }
}

// writeMarks and readMarks move a process's marks through a file (little-endian records).
func writeMarks(path string, recs []probe.Record) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	if err := binary.Write(w, binary.LittleEndian, recs); err != nil {
		_ = f.Close()
		return err
	}
	return errors.Join(w.Flush(), f.Close())
}

func readMarks(path string) ([]probe.Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	n := len(b) / binary.Size(probe.Record{})
	recs := make([]probe.Record, n)
	if err := binary.Read(strings.NewReader(string(b)), binary.LittleEndian, recs); err != nil {
		return nil, err
	}
	return recs, nil
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
