package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Mode says where the servers run.
type Mode string

// The modes.
const (
	// ModeTwoProcess runs each system's server in a process of its own, started and stopped
	// by the harness for every cell: what users deploy. The default.
	ModeTwoProcess Mode = "two-process"
	// ModeInProcess runs client and server in the harness's one process.
	ModeInProcess Mode = "inproc"
)

// ParseMode reads a -mode value.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModeTwoProcess, ModeInProcess:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown mode %q (have %s, %s)", s, ModeTwoProcess, ModeInProcess)
}

// SidesNote says what allocs/op, CPU/op and copied B/op cover in the mode; it is in every
// report.
func (m Mode) SidesNote() string {
	if m == ModeInProcess {
		return "client and server run in the same process for every system: allocs/op and CPU/op are both sides together"
	}
	return "each system's server runs in a process of its own (started by the harness for each cell, stopped with SIGTERM): allocs/op, CPU/op and copied B/op are the client's side only"
}

// ServeFlag is the hidden flag that makes the harness binary a server process:
// `mwrpcbench -serve-system NAME [-serve-cell stream] -listen 127.0.0.1:0`.
const ServeFlag = "-serve-system"

// CellKind names the kind of cell a server process serves (its -serve-cell flag).
type CellKind string

// The kinds of cells.
const (
	CellEcho   CellKind = "echo"   // the echo matrix: System.Serve
	CellStream CellKind = "stream" // the streaming cell: System.ServeStream
)

// ParseCellKind reads a -serve-cell value, or one entry of -cells.
func ParseCellKind(s string) (CellKind, error) {
	switch CellKind(s) {
	case CellEcho, CellStream:
		return CellKind(s), nil
	}
	return "", fmt.Errorf("unknown cell %q (have %s, %s)", s, CellEcho, CellStream)
}

// Timeouts of a server process's life.
const (
	serverStartTimeout = 10 * time.Second // until it prints its address
	serverStopTimeout  = 5 * time.Second  // from SIGTERM until it has exited; then SIGKILL
)

// ServeMain is the server process: it serves system's server for cell (its echo server,
// or its bulk server for the streaming cell) on a listener at listen, writes the
// listener's address and a newline to stdout, and serves until SIGTERM or SIGINT arrives or
// stdin reaches its end (the harness is gone), then stops the server and returns.
func ServeMain(system string, cell CellKind, listen string, stdin io.Reader, stdout io.Writer) error {
	s, err := LookupSystem(system)
	if err != nil {
		return err
	}
	serveFn := s.Serve
	switch {
	case cell == CellStream && !s.Streams():
		return fmt.Errorf("system %s is not in the streaming cell", system)
	case cell == CellStream:
		serveFn = s.ServeStream
	case !s.Echo():
		return fmt.Errorf("system %s is in the streaming cell only", system)
	case !s.TwoProcess():
		return fmt.Errorf("system %s runs in one process only", system)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv, err := serveFn(ln)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("%s: serve: %w", system, err)
	}
	if _, err := fmt.Fprintln(stdout, ln.Addr().String()); err != nil {
		return errors.Join(fmt.Errorf("write address: %w", err), srv.Close())
	}
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case <-sigs:
	case <-eof:
	}
	if err := srv.Close(); err != nil {
		return fmt.Errorf("%s: stop: %w", system, err)
	}
	return nil
}

// serverProfile names the CPU profile of a server process: "" without
// Config.ServerCPUProfile, else the prefix, the system and what the process serves, as in
// prefix.grpc.stream.pprof or prefix.mwrpc-tcp.echo.64B-c1.pprof.
func serverProfile(cfg Config, system string, cell CellKind, echo Cell) string {
	if cfg.ServerCPUProfile == "" {
		return ""
	}
	what := string(cell)
	if cell == CellEcho {
		what += fmt.Sprintf(".%dB-c%d", echo.Payload, echo.Concurrency)
	}
	return fmt.Sprintf("%s.%s.%s.pprof", cfg.ServerCPUProfile, system, what)
}

// serverProc is one server process the harness started.
type serverProc struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	stderr *headBuffer
	addr   string
	done   chan struct{} // closed when Wait has returned
	err    error         // Wait's, once done is closed
}

// startServer starts `exe -serve-system name -serve-cell cell -listen 127.0.0.1:0` in a
// process group of its own, which on Linux the kernel kills if the harness dies
// (Pdeathsig); the server also stops when its stdin, a pipe from the harness, reaches its
// end. It returns once the server has printed its address. profile, if not "", is passed
// as the server's -cpuprofile: it writes a CPU profile of its life there.
func startServer(exe, name string, cell CellKind, profile string) (*serverProc, error) {
	args := []string{ServeFlag, name, "-serve-cell", string(cell), "-listen", "127.0.0.1:0"}
	if profile != "" {
		args = append(args, "-cpuprofile", profile)
	}
	cmd := exec.Command(exe, args...)
	cmd.SysProcAttr = serverSysProcAttr()
	p := &serverProc{cmd: cmd, stderr: &headBuffer{max: 4 << 10}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	line := &firstLine{done: make(chan string, 1)}
	cmd.Stdout = line
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server process: %w", err)
	}
	p.stdin = stdin
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	timer := time.NewTimer(serverStartTimeout)
	defer timer.Stop()
	select {
	case p.addr = <-line.done:
		if p.addr != "" {
			return p, nil
		}
		err = errors.New("server process wrote no address")
	case <-p.done:
		err = errors.New("server process exited with no address written")
	case <-timer.C:
		err = fmt.Errorf("server process wrote no address in %v", serverStartTimeout)
	}
	return nil, errors.Join(err, p.stop(), p.stderrErr())
}

// stop sends SIGTERM and waits for the process to exit; after serverStopTimeout it kills
// the process group.
func (p *serverProc) stop() error {
	_ = p.stdin.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(serverStopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		if p.err != nil {
			return errors.Join(fmt.Errorf("server process: %w", p.err), p.stderrErr())
		}
		return nil
	case <-timer.C:
	}
	killGroup(p.cmd.Process.Pid)
	<-p.done
	return errors.Join(fmt.Errorf("server process did not exit within %v of SIGTERM: killed", serverStopTimeout), p.stderrErr())
}

func (p *serverProc) stderrErr() error {
	if s := strings.TrimSpace(p.stderr.String()); s != "" {
		return fmt.Errorf("server stderr: %s", s)
	}
	return nil
}

// remoteInstance is a client in this process and its server process.
type remoteInstance struct {
	Instance
	proc *serverProc
}

// Close closes the client, then stops the server process.
func (r *remoteInstance) Close() error {
	return errors.Join(r.Instance.Close(), r.proc.stop())
}

// ServerCPU returns the CPU time (user + system, all threads) the server process has used
// so far, where the system tells (Linux: /proc/PID/stat, in clock ticks of 10 ms).
func (r *remoteInstance) ServerCPU() (time.Duration, bool) { return r.proc.cpu() }

// ServerRunQueueWait returns how long the server process's threads have waited for a CPU
// so far (processRunQueueWait).
func (r *remoteInstance) ServerRunQueueWait() (time.Duration, bool) {
	return processRunQueueWait(r.proc.cmd.Process.Pid)
}

// cpu returns the CPU time the process has used so far (see remoteInstance.ServerCPU).
func (p *serverProc) cpu() (time.Duration, bool) { return processCPU(p.cmd.Process.Pid) }

// openRemote starts s's server process from exe and dials it; profile is startServer's.
func openRemote(exe string, s System, size, concurrency int, profile string) (Instance, error) {
	p, err := startServer(exe, s.Name, CellEcho, profile)
	if err != nil {
		return nil, err
	}
	cli, err := s.Dial(p.addr, size, concurrency)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("dial %s: %w", p.addr, err), p.stop())
	}
	return &remoteInstance{Instance: cli, proc: p}, nil
}

// firstLine is a server process's stdout: it sends the first line, trimmed, on done (once),
// and discards the rest.
type firstLine struct {
	mu   sync.Mutex
	buf  []byte
	sent bool
	done chan string
}

func (f *firstLine) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sent {
		return len(p), nil
	}
	f.buf = append(f.buf, p...)
	if i := bytes.IndexByte(f.buf, '\n'); i >= 0 {
		f.sent = true
		f.done <- strings.TrimSpace(string(f.buf[:i]))
	} else if len(f.buf) > 1<<10 {
		f.sent = true
		f.done <- "" // not an address
	}
	return len(p), nil
}

// headBuffer keeps the first max bytes written to it (a server's stderr, for errors).
type headBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (t *headBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := t.max - t.b.Len(); room > 0 {
		t.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (t *headBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b.String()
}
