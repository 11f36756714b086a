package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/load"
)

// The fault suite: server and caller joined by a veth pair this suite creates, faults
// injected on it with tc netem, processes killed with SIGKILL. It runs as root inside the
// rxe VM (scripts/rxe-vm, qemu with -nic none: no route leaves the guest), never on a host
// network. Every address is on the veth pair.
//
// soft: server and caller in network namespaces of their own (srv, cli), joined by the
// pair. ibv: Linux 6.1's rxe sends only from the initial namespace, so both stay there and
// policy routing sends their traffic across the pair (each address is reached through the
// other end's interface, and accept_local takes it in), where netem sees it.

const (
	srvAddr = "10.77.0.1"
	cliAddr = "10.77.0.2"
	port    = "7000"
)

// fabricNet is how one fabric's server and caller are placed.
type fabricNet struct {
	name       string
	srvPrefix  []string // command prefix for the server side (ip netns exec srv), or none
	cliPrefix  []string
	srvIf      string // the interfaces netem acts on (each side's egress)
	cliIf      string
	srvDevice  string // -device for the server and the caller (ibv), or ""
	cliDevice  string
	setup, end [][]string
}

func netFor(fabric string) (*fabricNet, error) {
	switch fabric {
	case "soft":
		return &fabricNet{name: "soft TCP", srvPrefix: []string{"ip", "netns", "exec", "srv"}, cliPrefix: []string{"ip", "netns", "exec", "cli"},
			srvIf: "vs", cliIf: "vc",
			setup: [][]string{
				{"ip", "netns", "add", "srv"}, {"ip", "netns", "add", "cli"},
				{"ip", "link", "add", "vs", "type", "veth", "peer", "name", "vc"},
				{"ip", "link", "set", "vs", "netns", "srv"}, {"ip", "link", "set", "vc", "netns", "cli"},
				{"ip", "-n", "srv", "addr", "add", srvAddr + "/24", "dev", "vs"}, {"ip", "-n", "srv", "link", "set", "vs", "up"}, {"ip", "-n", "srv", "link", "set", "lo", "up"},
				{"ip", "-n", "cli", "addr", "add", cliAddr + "/24", "dev", "vc"}, {"ip", "-n", "cli", "link", "set", "vc", "up"}, {"ip", "-n", "cli", "link", "set", "lo", "up"},
			},
			end: [][]string{{"ip", "netns", "del", "srv"}, {"ip", "netns", "del", "cli"}},
		}, nil
	case "ibv":
		return &fabricNet{name: "ibv (rxe)", srvIf: "vs", cliIf: "vc", srvDevice: "rxes", cliDevice: "rxec",
			setup: [][]string{
				{"sysctl", "-qw", "net.core.netdev_max_backlog=100000"}, // a 1 MiB READ is a burst of 1024 packets
				{"sysctl", "-qw", "net.ipv4.conf.all.accept_local=1", "net.ipv4.conf.all.rp_filter=0",
					"net.ipv4.conf.default.accept_local=1", "net.ipv4.conf.default.rp_filter=0"},
				{"ip", "link", "add", "vs", "type", "veth", "peer", "name", "vc"},
				{"sysctl", "-qw", "net.ipv4.conf.vs.accept_local=1", "net.ipv4.conf.vs.rp_filter=0",
					"net.ipv4.conf.vc.accept_local=1", "net.ipv4.conf.vc.rp_filter=0"},
				{"ip", "addr", "add", srvAddr + "/24", "dev", "vs"}, {"ip", "addr", "add", cliAddr + "/24", "dev", "vc"},
				{"ip", "link", "set", "vs", "up"}, {"ip", "link", "set", "vc", "up"},
				{"ip", "route", "add", cliAddr, "dev", "vs", "src", srvAddr, "table", "101"},
				{"ip", "route", "add", srvAddr, "dev", "vc", "src", cliAddr, "table", "102"},
				{"ip", "rule", "add", "pref", "10", "to", cliAddr, "iif", "lo", "table", "101"},
				{"ip", "rule", "add", "pref", "11", "to", srvAddr, "iif", "lo", "table", "102"},
				{"ip", "rule", "add", "pref", "1000", "lookup", "local"},
				{"ip", "rule", "del", "pref", "0", "lookup", "local"},
				{"rdma", "link", "add", "rxes", "type", "rxe", "netdev", "vs"},
				{"rdma", "link", "add", "rxec", "type", "rxe", "netdev", "vc"},
			},
			end: [][]string{{"rdma", "link", "del", "rxes"}, {"rdma", "link", "del", "rxec"}, {"ip", "link", "del", "vs"},
				{"ip", "rule", "add", "pref", "0", "lookup", "local"}, {"ip", "rule", "del", "pref", "1000"},
				{"ip", "rule", "del", "pref", "10"}, {"ip", "rule", "del", "pref", "11"}},
		}, nil
	}
	return nil, fmt.Errorf("-fabric %q: want soft or ibv", fabric)
}

// fault is one row of the suite.
type fault struct {
	name   string
	netem  string        // netem arguments on both interfaces during the fault, or ""
	length time.Duration // how long the fault lasts
	kill   string        // "server" or "client": SIGKILL it when the fault starts
}

var faults = []fault{
	{name: "none", length: 0},
	{name: "10% loss", netem: "loss 10%", length: 8 * time.Second},
	{name: "200±50 ms delay", netem: "delay 200ms 50ms", length: 8 * time.Second},
	{name: "reordering", netem: "delay 10ms reorder 25% 50%", length: 8 * time.Second},
	{name: "10 s partition", netem: "loss 100%", length: 10 * time.Second},
	{name: "kill -9 server", kill: "server", length: time.Second},
	{name: "kill -9 client", kill: "client", length: 0},
}

// Row is the outcome of one fault.
type Row struct {
	Fabric, Fault string
	Client        Summary
	// CallerConns is how many connections the server held for the caller just before the
	// fault (the stats connection not counted): its lanes.
	CallerConns int
	// After the fault, once the callers are gone: the server's windows still bound or granted,
	// pooled buffers and goroutines above what it held before the fault (with only the
	// stats connection), and whether it got there within the settle bound.
	ServerWindows, ServerPoolDelta, ServerGoroutineDelta int
	Problems                                             []string
}

// faultsCmd runs the suite for one fabric and prints its table; it fails when a row does.
func faultsCmd(args []string) error {
	fs := flag.NewFlagSet("faults", flag.ExitOnError)
	fabric := fs.String("fabric", "soft", "soft or ibv")
	deadline := fs.Duration("deadline", 2*time.Second, "each call's deadline")
	recoverBound := fs.Duration("recover-bound", 5*time.Second, "service must resume within this after a heal: the backoff ceiling (1s) plus TCP's SYN retransmission")
	only := fs.String("only", "", "run only the faults whose name contains this")
	sizes := fs.String("sizes", "64,4KiB,64KiB,1MiB", "request sizes, in turn")
	callers := fs.Int("callers", 4, "concurrent callers")
	lanes := fs.Int("lanes", 0, "the caller's connections to the server (call -lanes); 0: its adaptive default")
	lent := fs.Bool("lent", false, "the caller builds its requests in registered memory and takes its responses lent (call -lent)")
	_ = fs.Parse(args)
	if runtime.GOOS != "linux" {
		return fmt.Errorf("faults: not on %s: needs Linux (netem, veth pairs, network namespaces), root, inside the rxe VM (make test-faults)", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		return errors.New("faults: needs root inside the rxe VM (make test-faults)")
	}
	n, err := netFor(*fabric)
	if err != nil {
		return err
	}
	if *lanes > 0 {
		n.name += fmt.Sprintf(", %d lanes", *lanes)
	}
	if *lent {
		n.name += ", lent"
	}
	for _, c := range n.setup {
		if err := run(c...); err != nil {
			return fmt.Errorf("setting up the veth pair: %w", err)
		}
	}
	defer func() {
		for _, c := range n.end {
			_ = run(c...)
		}
	}()
	var rows []Row
	failed := false
	for _, f := range faults {
		if *only != "" && !strings.Contains(f.name, *only) {
			continue
		}
		r := runFault(n, f, workload{*deadline, *sizes, *callers, *lanes, *lent}, *recoverBound)
		if len(r.Problems) > 0 {
			failed = true
		}
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "faults: %s / %s: %d ok, %v failed, %d hung; %v\n", n.name, f.name, r.Client.OK, r.Client.Failed, r.Client.Hung, r.Problems)
	}
	printTable(os.Stdout, rows)
	if failed {
		return errors.New("faults: a row failed its checks (see the table)")
	}
	return nil
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// netem sets (args != "") or clears the fault on both interfaces.
func netem(n *fabricNet, args string) error {
	var errs []error
	for _, side := range []struct {
		prefix []string
		dev    string
	}{{n.srvPrefix, n.srvIf}, {n.cliPrefix, n.cliIf}} {
		c := append(append([]string{}, side.prefix...), "tc", "qdisc")
		if args == "" {
			c = append(c, "del", "dev", side.dev, "root")
		} else {
			c = append(c, "add", "dev", side.dev, "root", "netem")
			c = append(c, strings.Fields(args)...)
			c = append(c, "limit", "100000")
		}
		errs = append(errs, run(c...))
	}
	return errors.Join(errs...)
}

// startServer starts the server on the server side and waits for it to listen.
func startServer(n *fabricNet) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append(append([]string{}, n.srvPrefix...), self, "serve", "-listen", srvAddr+":"+port)
	if n.srvDevice != "" {
		args = append(args, "-device", n.srvDevice)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = childSysProcAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening ") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the server did not start: %q %v", line, err)
	}
	return cmd, nil
}

// callerAfterHeal is how long a caller goes on after the heal notice at least: the
// recovery bound, with room for calls to succeed after it.
const callerAfterHeal = 8 * time.Second

// caller starts a caller on the client side for d; its summary lands in out.
// With untilHeal it calls until callerAfterHeal past the heal notice (d bounds it).
func caller(n *fabricNet, d time.Duration, l workload, out *bytes.Buffer, untilHeal bool) (*callerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append(append([]string{}, n.cliPrefix...), self, "call", "-target", srvAddr+":"+port,
		"-duration", d.String(), "-deadline", l.deadline.String(), "-callers", strconv.Itoa(l.callers), "-sizes", l.sizes,
		"-delay", "50ms", "-backoff-max", "1s", "-after-heal", callerAfterHeal.String(), "-until-heal="+strconv.FormatBool(untilHeal),
		"-lanes", strconv.Itoa(l.lanes), "-lent="+strconv.FormatBool(l.lent))
	if n.cliDevice != "" {
		args = append(args, "-device", n.cliDevice)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = childSysProcAttr()
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	stdin, err := cmd.StdinPipe() // closed by Wait
	if err != nil {
		return nil, err
	}
	return &callerProc{Cmd: cmd, stdin: stdin}, cmd.Start()
}

// statsFromClientSide asks the server for its Stats from the caller's side.
func statsFromClientSide(n *fabricNet) (*load.Stats, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append(append([]string{}, n.cliPrefix...), self, "stats", "-target", srvAddr+":"+port)
	if n.cliDevice != "" {
		args = append(args, "-device", n.cliDevice)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).Output()
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	var st load.Stats
	return &st, json.Unmarshal(out, &st)
}

// workload is what each caller of a row runs.
type workload struct {
	deadline time.Duration
	sizes    string
	callers  int
	lanes    int  // the caller's connections to the server; 0: its adaptive default
	lent     bool // the caller's requests built in registered memory, its responses lent
}

func runFault(n *fabricNet, f fault, l workload, recoverBound time.Duration) (r Row) {
	r = Row{Fabric: n.name, Fault: f.name}
	fr := &faultRun{n: n, row: &r}
	srv, err := startServer(n)
	if err != nil {
		fr.problem("%v", err)
		return r
	}
	fr.srv = srv
	defer fr.stopServer()
	before, err := statsFromClientSide(n)
	if err != nil {
		fr.problem("before: %v", err)
		return r
	}
	cl, out, ok := fr.strike(f, l, &before)
	if !ok {
		return r
	}
	if err := cl.Wait(); err != nil {
		fr.problem("caller: %v", err)
	}
	if !fr.checkClient(out, f, recoverBound) {
		return r
	}
	fr.checkServer(before)
	return r
}

// faultRun is one row of the fault suite while it runs: the server process (a new one
// after a server kill) and the row its problems go to.
type faultRun struct {
	n   *fabricNet
	srv *exec.Cmd
	row *Row
}

func (fr *faultRun) problem(format string, a ...any) {
	fr.row.Problems = append(fr.row.Problems, fmt.Sprintf(format, a...))
}

// stopServer ends the server process: SIGTERM, then SIGKILL after 10 s.
func (fr *faultRun) stopServer() {
	srv := fr.srv
	_ = srv.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = srv.Process.Kill()
		<-done
	}
}

// strike starts the callers, strikes with the fault after a lead (netem on the link, a
// kill of the server or of the caller) and heals it; it returns the caller running on and
// the buffer its summary goes to. After a server restart, before is the new server's
// baseline. ok is false when the row cannot go on (its problem recorded).
func (fr *faultRun) strike(f fault, l workload, before **load.Stats) (cl *callerProc, out *bytes.Buffer, ok bool) {
	const lead, tail = 3 * time.Second, 8 * time.Second
	n := fr.n
	total := lead + f.length + tail
	out = new(bytes.Buffer)
	// A row with a heal calls until well after it, however long setting the fault up and
	// healing it took (tc on a slow machine can take seconds).
	heals := f.netem != "" || f.kill == "server"
	if heals {
		total += time.Minute // a bound only
	}
	cl, err := caller(n, total, l, out, heals)
	if err != nil {
		fr.problem("%v", err)
		return nil, nil, false
	}
	time.Sleep(lead)
	fr.countCallerConns(l.lanes)
	switch {
	case f.netem != "":
		if err := netem(n, f.netem); err != nil {
			fr.problem("%v", err)
		}
		time.Sleep(f.length)
		if err := netem(n, ""); err != nil {
			fr.problem("%v", err)
		}
		if err := sendHeal(cl); err != nil {
			fr.problem("%v", err)
		}
	case f.kill == "server":
		_ = fr.srv.Process.Kill()
		_ = fr.srv.Wait()
		time.Sleep(f.length)
		srv, err := startServer(n)
		if err != nil {
			fr.problem("restart: %v", err)
			_ = cl.Process.Kill()
			_ = cl.Wait()
			return nil, nil, false
		}
		fr.srv = srv
		if err := sendHeal(cl); err != nil {
			fr.problem("%v", err)
		}
		if *before, err = statsFromClientSide(n); err != nil { // the new server's own baseline
			fr.problem("after the restart: %v", err)
		}
	case f.kill == "client":
		_ = cl.Process.Kill() // mid-call: every caller has a call out (the server holds each 50 ms)
		_ = cl.Wait()
		out.Reset()
		if cl, err = caller(n, tail, l, out, false); err != nil { // service goes on for a new client
			fr.problem("%v", err)
			return nil, nil, false
		}
	}
	return cl, out, true
}

// countCallerConns records how many connections the server holds for the caller, and a
// problem if that stays fewer than the lanes it was asked to keep for callerLanesBound
// (a lane may be between connections when first counted: the emulated guest is slow
// enough for a keepalive to give up on a busy one).
func (fr *faultRun) countCallerConns(lanes int) {
	for deadline := time.Now().Add(callerLanesBound); ; time.Sleep(200 * time.Millisecond) {
		st, err := statsFromClientSide(fr.n)
		if err != nil {
			fr.problem("counting the caller's connections: %v", err)
			return
		}
		fr.row.CallerConns = st.Conns - 1 // the stats connection's own
		if fr.row.CallerConns >= lanes {
			return
		}
		if time.Now().After(deadline) {
			fr.problem("the caller had %d connections to the server, not the %d lanes asked for, for %v", fr.row.CallerConns, lanes, callerLanesBound)
			return
		}
	}
}

// callerLanesBound is how long a caller may take to hold the lanes it was asked for.
const callerLanesBound = 5 * time.Second

// checkClient reads the caller's summary into the row and records what it shows wrong:
// hung or misdelivered calls, a call past its deadline, no success, what the client kept,
// or service resuming later than recoverBound after a heal. It returns false when there
// was no summary to read.
func (fr *faultRun) checkClient(out *bytes.Buffer, f fault, recoverBound time.Duration) bool {
	if err := json.Unmarshal(out.Bytes(), &fr.row.Client); err != nil {
		fr.problem("caller's summary %q: %v", out.String(), err)
		return false
	}
	c := fr.row.Client
	switch {
	case c.Hung > 0:
		fr.problem("%d calls hung", c.Hung)
	case c.Mismatched > 0:
		fr.problem("%d responses reached the wrong call", c.Mismatched)
	case c.MaxCallMs > c.DeadlineMs+float64(HangBound/time.Millisecond):
		fr.problem("a call took %.0f ms against a %.0f ms deadline", c.MaxCallMs, c.DeadlineMs)
	case c.OK == 0:
		fr.problem("no call succeeded")
	case c.WindowsExposedAfter != 0 || c.GoroutinesLeaked != 0:
		fr.problem("the client kept %d windows bound and %d goroutines", c.WindowsExposedAfter, c.GoroutinesLeaked)
	case c.CloseError != "":
		fr.problem("the client's Close: %s", c.CloseError)
	case c.ReleaseFailed != 0:
		fr.problem("%d lent responses refused by Release", c.ReleaseFailed)
	}
	if f.length > 0 && (c.RecoverMs < 0 || c.RecoverMs > float64(recoverBound/time.Millisecond)) {
		fr.problem("service resumed %.0f ms after the heal (bound %v)", c.RecoverMs, recoverBound)
	}
	return true
}

// checkServer waits (30 s at most), the callers gone, for the server to return to what it
// held before (the stats connection's own slots), within the peer timeout and the lease,
// and records in the row what it kept.
func (fr *faultRun) checkServer(before *load.Stats) {
	var after *load.Stats
	var err error
	for wait := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if after, err = statsFromClientSide(fr.n); err != nil {
			fr.problem("after: %v", err)
			return
		}
		if after.WindowsExposed+after.Grants == 0 && after.PoolInUse <= before.PoolInUse && after.Goroutines <= before.Goroutines+2 || time.Now().After(wait) {
			break
		}
	}
	r := fr.row
	r.ServerWindows, r.ServerPoolDelta, r.ServerGoroutineDelta = after.WindowsExposed+after.Grants, after.PoolInUse-before.PoolInUse, after.Goroutines-before.Goroutines
	if r.ServerWindows != 0 || r.ServerPoolDelta > 0 || r.ServerGoroutineDelta > 2 {
		fr.problem("the server kept %d windows bound or granted, %d pooled buffers and %d goroutines", r.ServerWindows, r.ServerPoolDelta, r.ServerGoroutineDelta)
	}
}

// printTable writes the rows as a markdown table.
func printTable(w *os.File, rows []Row) {
	fmt.Fprintln(w, "| fabric | fault | caller's conns | calls ok | failed by status | wrong call | hung | max call / deadline (ms) | windows bound after (client, server's bound or granted) | server pool, goroutines after | recovered after heal (ms) | result |")
	fmt.Fprintln(w, "|---|---|---:|---:|---|---:|---:|---|---|---|---:|---|")
	for _, r := range rows {
		var failed []string
		for k, v := range r.Client.Failed {
			failed = append(failed, fmt.Sprintf("%s %d", k, v))
		}
		sort.Strings(failed)
		rec := "-"
		if r.Client.RecoverMs >= 0 {
			rec = fmt.Sprintf("%.0f", r.Client.RecoverMs)
		}
		result := "ok"
		if len(r.Problems) > 0 {
			result = "FAIL: " + strings.Join(r.Problems, "; ")
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %d | %d | %.0f / %.0f | %d, %d | %+d, %+d | %s | %s |\n",
			r.Fabric, r.Fault, r.CallerConns, r.Client.OK, strings.Join(failed, ", "), r.Client.Mismatched, r.Client.Hung,
			r.Client.MaxCallMs, r.Client.DeadlineMs, r.Client.WindowsExposedAfter, r.ServerWindows,
			r.ServerPoolDelta, r.ServerGoroutineDelta, rec, result)
	}
}
