// Command mwrpcbench measures mwrpc side by side with gRPC-Go, DRPC, net/rpc and a raw TCP
// ping-pong, in one run on one machine, and writes the results as JSON, a markdown table
// and PNG charts.
//
// Modes (-mode):
//
//	two-process  the default: each system's server runs in a process of its own, this
//	             binary started again with a hidden `-serve-system NAME -listen 127.0.0.1:0`
//	             (it prints its address on stdout, serves until SIGTERM or the end of its
//	             stdin, and on Linux dies with the harness: Pdeathsig), one per system per
//	             cell, stopped with SIGTERM (SIGKILL to its process group after 5 s)
//	inproc       client and server in this one process
//
// Systems (-systems, comma-separated; all by default):
//
//	mwrpc-tcp     mwrpc over the soft provider's TCP fabric (what rpc.Dial does by default)
//	mwrpc-tls     the same inside TLS 1.3 (rpc.WithTransportCredentials)
//	mwrpc-inproc  mwrpc over the soft provider's in-process fabric (inproc mode only)
//	grpc          gRPC-Go, a hand-written ServiceDesc and a raw-bytes codec (no protobuf)
//	drpc          DRPC (storj.io/drpc), a hand-written description and a raw-bytes encoding,
//	              one connection per caller (a DRPC connection carries one call at a time)
//	netrpc        net/rpc (gob) over TCP
//	rawtcp        a length-prefixed echo over TCP: the floor
//	mwrpc-stream16M  the streaming cell only: mwrpc-tcp's streams with a 16 MiB stream
//	              window on both sides (transport.Config.StreamWindow; the default is 4 MiB)
//
// Built with -tags ibverbs (cgo, libibverbs), the harness has one system more, which runs
// only when -systems names it (it needs an RDMA device):
//
//	mwrpc-ibv     mwrpc over the cgo ibv provider, server and client on the RDMA device
//	              MWRPC_IBV_DEVICE names (default: the first); connections are set up over
//	              loopback TCP, calls go over the device. make bench-rxe runs it on
//	              Soft-RoCE (rxe0) in a VM, beside mwrpc-tcp and rawtcp in the same VM.
//
// Each system echoes payloads of each size (-payloads) from each number of concurrent
// callers (-concurrency) sharing one client (raw TCP: one connection per caller). Per
// cell, every system is set up, warmed up, then measured -rounds times for -duration,
// the systems interleaved and their order rotated each round; reports show medians across
// rounds. In two-process mode allocations, CPU time and the soft provider's copy counters
// are the client's side only; in inproc mode both sides together. Cells with more than
// -max-inflight bytes in flight per direction (payload × concurrency) are skipped: by
// default 16 MiB runs at concurrency 1 and 4 only (1 MiB c64 and 64 KiB c64 run).
//
// The streaming cell (-cells stream; both cells run by default) moves -stream-size (1 GiB;
// -quick: 256 MiB) each way in messages of -stream-chunk (1 MiB), one stream at a time
// over one connection, per system that streams (rawtcp: a bulk copy, the floor; grpc:
// server- and client-streaming methods; mwrpc-tcp and mwrpc-stream16M: rpc streams, the
// latter with a 16 MiB stream window): a server stream (the client asks, the server
// sends, the client checks each message's length and last byte) and a client stream (the
// client sends, the server checks each message and answers once). Each is measured
// -rounds times, systems interleaved, in the mode's processes; reports show MB/s and CPU
// seconds per GiB of the client and of the server process, medians across rounds.
//
// Outputs, in -out (results, or results/quick with -quick): latest.json, latest.md, and
// the charts latency_p50.png, throughput_ops.png and throughput_mbps.png (the echo
// matrix) and stream_mbps.png (the streaming cell). In two-process mode latest.md ends
// with the goals mwrpc is held to, evaluated on the run (bench.Report.Goals: one Client
// over soft TCP against DRPC, Kitex and raw TCP, the shm fabric against shmipc-go and raw
// TCP). The markdown is printed to stdout as well; progress goes to stderr (a bar on a
// terminal).
//
//	cd benchmarks && go run ./cmd/mwrpcbench -quick   # 64 B, 64 KiB, 1 MiB at concurrency 1 and 16
//	cd benchmarks && go run ./cmd/mwrpcbench          # the full matrix, a few minutes
//	cd benchmarks && go run ./cmd/mwrpcbench -quick -mode inproc
//	cd benchmarks && go run ./cmd/mwrpcbench -cells stream   # the streaming cell alone
//	go run ./cmd/mwrpcbench -systems mwrpc-tcp -payloads 64 -concurrency 1 -cpuprofile cpu.pprof
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/mwrpc/mwrpc/benchmarks/internal/bench"
	"github.com/mwrpc/mwrpc/benchmarks/internal/load"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, term.IsTerminal(int(os.Stderr.Fd()))))
}

// isServe reports whether args ask for a server process (the hidden flag, first).
func isServe(args []string) bool {
	return len(args) > 0 && (args[0] == bench.ServeFlag || strings.HasPrefix(args[0], bench.ServeFlag+"="))
}

// serve is a server process: `mwrpcbench -serve-system NAME -listen ADDR`.
func serve(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mwrpcbench (server process)", flag.ContinueOnError)
	fs.SetOutput(stderr)
	system := fs.String(bench.ServeFlag[1:], "", "system to serve")
	cellName := fs.String("serve-cell", string(bench.CellEcho), "what to serve: "+string(bench.CellEcho)+" (the echo server) or "+string(bench.CellStream)+" (the bulk server of the streaming cell)")
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the server process's life to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cell, err := bench.ParseCellKind(*cellName)
	if err != nil {
		fmt.Fprintln(stderr, "mwrpcbench server:", err)
		return 2
	}
	if *cpuprofile != "" {
		stop, err := startCPUProfile(*cpuprofile)
		if err != nil {
			fmt.Fprintln(stderr, "mwrpcbench server:", err)
			return 1
		}
		defer stop()
	}
	if list := os.Getenv(bench.ServeCPUsEnv); list != "" { // the harness's -cpus split
		cpus, err := bench.ParseCPUList(list)
		if err == nil {
			err = bench.PinCPUs(cpus)
		}
		if err != nil {
			fmt.Fprintln(stderr, "mwrpcbench server:", err)
			return 1
		}
	}
	// The harness closes stdin, then sends SIGTERM: a server that stops on stdin's end
	// returns from ServeMain, which lets go of the signals, and the SIGTERM arriving then
	// would kill the exiting process ("signal: terminated"). Held here until exit.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM, syscall.SIGINT)
	if err := bench.ServeMain(*system, cell, *listen, stdin, stdout); err != nil {
		fmt.Fprintln(stderr, "mwrpcbench server:", err)
		return 1
	}
	return 0
}

// The matrices.
const (
	fullPayloads     = "64,4KiB,64KiB,1MiB,16MiB"
	fullConcurrency  = "1,4,16,64"
	quickPayloads    = "64,64KiB,1MiB"
	quickConcurrency = "1,16"
	fullStream       = "1GiB"
	quickStream      = "256MiB"
)

// run is the command; it returns the exit status. tty says whether stderr is a terminal.
func run(args []string, stdout, stderr io.Writer, tty bool) int {
	if isServe(args) {
		return serve(args, os.Stdin, stdout, stderr)
	}
	fs, o := newFlags(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mwrpcbench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if o.listSystems {
		all, _ := bench.LookupSystems("all")
		for _, s := range all {
			if s.TwoProcess() {
				fmt.Fprintln(stdout, s.Name)
			}
		}
		return 0
	}
	if o.quick {
		quickDefaults(fs)
	}
	if o.cpus != "" {
		split, err := bench.ParseCPUSplit(o.cpus)
		if err != nil {
			return usage(stderr, fmt.Errorf("-cpus: %w", err))
		}
		if err := bench.PinCPUs(split.Client); err != nil {
			fmt.Fprintln(stderr, "mwrpcbench:", err)
			return 1
		}
		_ = os.Setenv(bench.ServeCPUsEnv, bench.FormatCPUList(split.Server))
		o.split = split
	}
	p, err := o.plan(stderr)
	if err != nil {
		return usage(stderr, err)
	}
	if o.listCells {
		fmt.Fprintln(stdout, len(p.cells))
		return 0
	}
	if p.runEcho && len(p.cells) == 0 {
		return usage(stderr, errors.New("every cell is above -max-inflight"))
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		fmt.Fprintln(stderr, "mwrpcbench:", err)
		return 1
	}
	start := time.Now()
	rep := p.report(args, start)
	p.announce(stderr, rep, o.maxInflight)
	return o.execute(p, rep, start, stdout, stderr, tty)
}

// options are mwrpcbench's flags.
type options struct {
	mode, systems, payloads, concurrency, maxInflight, out string
	cpuprofile, serverProf, cells, streamSize, streamChunk string
	contention                                             bool
	cpus                                                   string
	duration, warmup                                       time.Duration
	rounds                                                 int
	quick, listCells, listSystems, keepGoing               bool
	split                                                  bench.CPUSplit // -cpus, parsed
}

// newFlags defines the flags, into the options returned.
func newFlags(stderr io.Writer) (*flag.FlagSet, *options) {
	fs := flag.NewFlagSet("mwrpcbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.StringVar(&o.mode, "mode", string(bench.ModeTwoProcess), "where servers run: "+string(bench.ModeTwoProcess)+" (a process per system) or "+string(bench.ModeInProcess)+" (this process)")
	fs.BoolVar(&o.quick, "quick", false, "reduced matrix ("+quickPayloads+"; concurrency "+quickConcurrency+"; shorter rounds): under a minute")
	fs.StringVar(&o.systems, "systems", "all", "systems to run, comma-separated: "+strings.Join(bench.SystemNames(), ","))
	fs.StringVar(&o.payloads, "payloads", fullPayloads, "payload sizes, comma-separated (64, 4KiB, 1MiB ...)")
	fs.StringVar(&o.concurrency, "concurrency", fullConcurrency, "concurrent callers per system, comma-separated")
	fs.DurationVar(&o.duration, "duration", time.Second, "measured time per system per round (-quick: 300ms)")
	fs.DurationVar(&o.warmup, "warmup", 200*time.Millisecond, "unmeasured time per system per cell, after setup (-quick: 100ms)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per cell; reports show medians across rounds")
	fs.StringVar(&o.maxInflight, "max-inflight", "128MiB", "skip cells whose payload × concurrency exceeds this (0: no cap)")
	fs.StringVar(&o.out, "out", "results", "output directory (-quick: results/quick)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file (the harness's process: the clients, in two-process mode)")
	fs.StringVar(&o.serverProf, "server-cpuprofile", "", "two-process mode: every server process writes a CPU profile of its life to PREFIX.SYSTEM.CELL.pprof")
	fs.BoolVar(&o.contention, "contention", false, "with -cpuprofile or -server-cpuprofile: also write mutex and block profiles beside each CPU profile (NAME.mutex.pprof, NAME.block.pprof), which costs some throughput")
	fs.StringVar(&o.cells, "cells", "echo,stream", "what to run, comma-separated: echo (the matrix of -payloads × -concurrency) and stream (the streaming cell)")
	fs.StringVar(&o.streamSize, "stream-size", fullStream, "bytes per transfer of the streaming cell, each way (-quick: "+quickStream+")")
	fs.StringVar(&o.streamChunk, "stream-chunk", "1MiB", "bytes per message of the streaming cell")
	fs.BoolVar(&o.listCells, "list-cells", false, "print how many echo cells -payloads, -concurrency and -max-inflight make, and exit")
	fs.BoolVar(&o.listSystems, "list-systems", false, "print the systems of the two-process echo matrix that \"all\" runs, one a line, and exit")
	fs.BoolVar(&o.keepGoing, "keep-going", false, "a system that fails in a cell leaves that cell (the report's notes say why) instead of ending the run")
	fs.StringVar(&o.cpus, "cpus", "", "SERVER/CLIENT CPU lists, as 0-7/8-15 (Linux): server processes run on the first, this process (the clients) on the second, GOMAXPROCS the count of each, so that one many-core machine behaves like two hosts")
	return fs, o
}

// quickDefaults gives -quick's values to the flags not set on the command line.
func quickDefaults(fs *flag.FlagSet) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, v := range map[string]string{"payloads": quickPayloads, "concurrency": quickConcurrency,
		"duration": "300ms", "warmup": "100ms", "out": filepath.Join("results", "quick"), "stream-size": quickStream} {
		if !set[name] {
			_ = fs.Set(name, v)
		}
	}
}

// plan is what a run does, read from the options: the harness's configuration, which
// cells run, and which systems run or are left out of them.
type plan struct {
	cfg                        bench.Config
	split                      bench.CPUSplit
	runEcho, runStream         bool
	echoSystems, streamSystems []bench.System
	leftOut, notes             []string
	cells, skipped             []bench.Cell
}

// plan checks the options and makes the run's plan; its errors are usage errors.
func (o *options) plan(stderr io.Writer) (*plan, error) {
	p := &plan{cfg: bench.Config{Duration: o.duration, Warmup: o.warmup, Rounds: o.rounds}, split: o.split}
	var err error
	if p.cfg.Mode, err = bench.ParseMode(o.mode); err != nil {
		return nil, fmt.Errorf("-mode: %w", err)
	}
	if p.runEcho, p.runStream, err = parseCells(o.cells); err != nil {
		return nil, fmt.Errorf("-cells: %w", err)
	}
	if p.cfg.Systems, err = bench.LookupSystems(o.systems); err != nil {
		return nil, err
	}
	if err := p.chooseSystems(stderr); err != nil {
		return nil, err
	}
	if err := o.sizes(&p.cfg); err != nil {
		return nil, err
	}
	if p.cfg.Rounds < 1 || p.cfg.Duration <= 0 || p.cfg.Warmup < 0 {
		return nil, errors.New("-rounds and -duration must be positive, -warmup not negative")
	}
	p.cells, p.skipped = p.cfg.Cells()
	return p, nil
}

// chooseSystems picks the systems of each cell, and drops a cell that none of -systems
// runs where another cell is left.
func (p *plan) chooseSystems(stderr io.Writer) error {
	var err error
	p.echoSystems, p.leftOut = p.cfg.RunSystems()
	p.streamSystems = p.cfg.StreamRunSystems()
	if p.notes, err = bench.Notes(p.echoSystems); err != nil {
		return fmt.Errorf("-systems: %w", err)
	}
	switch {
	case p.runEcho && len(p.echoSystems) == 0 && len(p.leftOut) > 0:
		return fmt.Errorf("-systems: %s run in %s mode only", strings.Join(p.leftOut, ", "), bench.ModeInProcess)
	case p.runEcho && len(p.echoSystems) == 0 && p.runStream && len(p.streamSystems) > 0:
		p.runEcho = false // -systems names streaming systems only
	case p.runEcho && len(p.echoSystems) == 0:
		return errors.New("-systems: no system of the echo matrix")
	}
	switch {
	case p.runStream && len(p.streamSystems) == 0 && p.runEcho:
		p.runStream = false
		fmt.Fprintf(stderr, "mwrpcbench: no system of -systems streams: no streaming cell\n")
	case p.runStream && len(p.streamSystems) == 0:
		return fmt.Errorf("-systems: no system of the streaming cell (%s)", strings.Join(streamNames(), ", "))
	}
	return nil
}

// sizes reads the size flags into cfg: the streaming cell's, the payloads, the
// concurrencies and the in-flight cap.
func (o *options) sizes(cfg *bench.Config) error {
	streamBytes, err := parseBytes(o.streamSize)
	if err != nil || streamBytes <= 0 {
		return fmt.Errorf("-stream-size: bad size %q", o.streamSize)
	}
	if cfg.StreamChunk, err = load.ParseSize(o.streamChunk); err != nil || cfg.StreamChunk <= 0 || cfg.StreamChunk > 64<<20 {
		return fmt.Errorf("-stream-chunk: bad size %q (1 B to 64 MiB)", o.streamChunk)
	}
	cfg.StreamBytes = streamBytes
	if cfg.Payloads, err = parseList(o.payloads, load.ParseSize); err != nil {
		return fmt.Errorf("-payloads: %w", err)
	}
	if cfg.Concurrency, err = parseList(o.concurrency, strconv.Atoi); err != nil {
		return fmt.Errorf("-concurrency: %w", err)
	}
	inflight, err := load.ParseSize(o.maxInflight)
	if err != nil {
		return fmt.Errorf("-max-inflight: %w", err)
	}
	cfg.MaxInflight = int64(inflight)
	return nil
}

// report starts the run's report: the machine and how the run was set up.
func (p *plan) report(args []string, start time.Time) *bench.Report {
	cfg := &p.cfg
	rep := &bench.Report{Machine: bench.ThisMachine(start)}
	rep.Setup = bench.Setup{
		Command:          strings.TrimSpace("mwrpcbench " + strings.Join(args, " ")),
		Source:           bench.Source(),
		LoadAvg:          [2]float64{bench.LoadAvg()},
		Mode:             cfg.Mode,
		Sides:            cfg.Mode.SidesNote(),
		LeftOut:          p.leftOut,
		Payloads:         cfg.Payloads,
		Concurrency:      cfg.Concurrency,
		DurationNs:       cfg.Duration.Nanoseconds(),
		WarmupNs:         cfg.Warmup.Nanoseconds(),
		Rounds:           cfg.Rounds,
		MaxInflightBytes: cfg.MaxInflight,
		SkippedCells:     []string{},
		Notes:            p.notes,
	}
	if p.split.Server != nil {
		rep.Setup.Notes = append(rep.Setup.Notes, fmt.Sprintf("-cpus %s: server processes pinned to CPUs %s (GOMAXPROCS %d), the clients to CPUs %s (GOMAXPROCS %d)",
			p.split, bench.FormatCPUList(p.split.Server), len(p.split.Server), bench.FormatCPUList(p.split.Client), len(p.split.Client)))
	}
	if p.runEcho {
		rep.Setup.Cells = append(rep.Setup.Cells, bench.CellEcho)
		for _, s := range p.echoSystems {
			rep.Setup.Systems = append(rep.Setup.Systems, bench.SystemInfo{Name: s.Name, Desc: s.Desc})
		}
		for _, c := range p.skipped {
			rep.Setup.SkippedCells = append(rep.Setup.SkippedCells, c.String())
		}
	} else {
		rep.Setup.Payloads, rep.Setup.Concurrency = nil, nil
		p.leftOut, p.skipped, rep.Setup.LeftOut = nil, nil, nil
	}
	if p.runStream {
		rep.Setup.Cells = append(rep.Setup.Cells, bench.CellStream)
		rep.Setup.StreamBytes, rep.Setup.StreamChunkBytes = cfg.StreamBytes, cfg.StreamChunk
		for _, s := range p.streamSystems {
			rep.Setup.StreamSystems = append(rep.Setup.StreamSystems, bench.SystemInfo{Name: s.Name, Desc: s.StreamDesc})
		}
	}
	return rep
}

// announce says on stderr what the run will do and leave out.
func (p *plan) announce(stderr io.Writer, rep *bench.Report, maxInflight string) {
	cfg := &p.cfg
	if p.runEcho {
		fmt.Fprintf(stderr, "mwrpcbench: %s mode: %d cells × %d systems × %d rounds of %v; %s\n",
			cfg.Mode, len(p.cells), len(p.echoSystems), cfg.Rounds, cfg.Duration, cfg.Mode.SidesNote())
	}
	if p.runStream {
		fmt.Fprintf(stderr, "mwrpcbench: %s mode: streaming cell: %d systems × %d rounds × (a server stream and a client stream of %s in %s messages)\n",
			cfg.Mode, len(p.streamSystems), cfg.Rounds, bench.SizeName64(cfg.StreamBytes), bench.SizeName(cfg.StreamChunk))
	}
	if len(p.leftOut) > 0 {
		fmt.Fprintf(stderr, "mwrpcbench: skipping %s: in-process only (run it with -mode %s)\n",
			strings.Join(p.leftOut, ", "), bench.ModeInProcess)
	}
	for _, n := range rep.Setup.Notes {
		fmt.Fprintln(stderr, "mwrpcbench: note:", n)
	}
	if len(p.skipped) > 0 {
		fmt.Fprintf(stderr, "mwrpcbench: skipping %s (more than %s in flight per direction; see -max-inflight)\n",
			strings.Join(rep.Setup.SkippedCells, ", "), maxInflight)
	}
}

// execute runs the plan's cells into rep and writes the results; it returns the exit
// status.
func (o *options) execute(p *plan, rep *bench.Report, start time.Time, stdout, stderr io.Writer, tty bool) int {
	cfg := p.cfg
	if o.contention { // server processes inherit it
		if err := os.Setenv(contentionEnv, "1"); err != nil {
			fmt.Fprintln(stderr, "mwrpcbench:", err)
			return 1
		}
	}
	if o.cpuprofile != "" {
		stop, err := startCPUProfile(o.cpuprofile)
		if err != nil {
			fmt.Fprintln(stderr, "mwrpcbench:", err)
			return 1
		}
		defer stop()
	}
	var err error
	if o.serverProf != "" {
		if cfg.ServerCPUProfile, err = filepath.Abs(o.serverProf); err != nil {
			fmt.Fprintln(stderr, "mwrpcbench:", err)
			return 1
		}
	}
	cfg.Progress = bench.NewProgress(stderr, tty, cfg.Rounds)
	if o.keepGoing {
		cfg.KeepGoing = true
		cfg.OnFailure = func(cell bench.Cell, system string, err error) {
			line := fmt.Sprintf("%v: %s left the cell: %v", cell, system, err)
			fmt.Fprintln(stderr, "mwrpcbench:", line)
			rep.Setup.Notes = append(rep.Setup.Notes, line)
		}
	}
	if p.runEcho {
		rep.Results, err = bench.Run(cfg)
	}
	if err == nil && p.runStream {
		rep.StreamResults, err = bench.RunStreams(cfg)
	}
	rep.Setup.LoadAvg[1] = bench.LoadAvg()
	rep.Setup.WallSeconds = float64(time.Since(start).Round(100*time.Millisecond)) / 1e9
	if err != nil {
		fmt.Fprintln(stderr, "mwrpcbench:", err)
		return 1
	}
	if err := write(rep, o.out, stdout); err != nil {
		fmt.Fprintln(stderr, "mwrpcbench:", err)
		return 1
	}
	fmt.Fprintf(stderr, "mwrpcbench: wrote %s/latest.{json,md} and charts in %v\n", o.out, time.Since(start).Round(100*time.Millisecond))
	return 0
}

// write puts latest.json, the charts and latest.md into dir, and the markdown on stdout.
func write(rep *bench.Report, dir string, stdout io.Writer) error {
	if err := rep.WriteJSON(filepath.Join(dir, "latest.json")); err != nil {
		return err
	}
	charts, err := bench.WriteCharts(dir, rep.Setup.Mode, rep.Results)
	if err != nil {
		return err
	}
	if c, err := bench.WriteStreamChart(dir, rep.Setup.Mode, rep.StreamResults); err != nil {
		return err
	} else if c != "" {
		charts = append(charts, c)
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md, charts); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md.String())
	return err
}

func usage(stderr io.Writer, err error) int {
	fmt.Fprintln(stderr, "mwrpcbench:", err)
	return 2
}

// contentionEnv, set by -contention, has startCPUProfile write mutex and block profiles
// too, in the harness and in the server processes it starts.
const contentionEnv = "MWRPCBENCH_CONTENTION"

// startCPUProfile profiles this process into path until stop is called; with
// contentionEnv set it also records contention and writes it beside path on stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	contention := os.Getenv(contentionEnv) != ""
	if contention {
		runtime.SetMutexProfileFraction(10) // one contended unlock in ten
		runtime.SetBlockProfileRate(10_000) // every blocking over 10 µs, shorter ones sampled
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		if contention {
			base := strings.TrimSuffix(path, ".pprof")
			writeProfile("mutex", base+".mutex.pprof")
			writeProfile("block", base+".block.pprof")
		}
	}, nil
}

// writeProfile writes the named runtime profile to path; a failure is said on stderr
// (the run's figures stand without it).
func writeProfile(name, path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup(name).WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mwrpcbench: %s profile: %v\n", name, err)
	}
}

// parseCells reads -cells.
func parseCells(s string) (echo, stream bool, err error) {
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		c, err := bench.ParseCellKind(f)
		if err != nil {
			return false, false, err
		}
		echo, stream = echo || c == bench.CellEcho, stream || c == bench.CellStream
	}
	if !echo && !stream {
		return false, false, fmt.Errorf("no cell in %q", s)
	}
	return echo, stream, nil
}

// streamNames names the systems of the streaming cell.
func streamNames() []string {
	var out []string
	for _, s := range bench.Systems {
		if s.Streams() {
			out = append(out, s.Name)
		}
	}
	return out
}

// parseBytes reads a size that may be given in GiB (1GiB, 2g), or as load.ParseSize
// reads it.
func parseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, suffix := range []string{"gib", "g"} {
		if strings.HasSuffix(t, suffix) {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(t, suffix)), 10, 64)
			if err != nil || n < 0 || n > 1<<10 {
				return 0, fmt.Errorf("bad size %q", s)
			}
			return n << 30, nil
		}
	}
	n, err := load.ParseSize(s)
	return int64(n), err
}

func parseList(s string, parse func(string) (int, error)) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := parse(f)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return nil, fmt.Errorf("%q: must be positive", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list %q", s)
	}
	return out, nil
}
