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
// matrix) and stream_mbps.png (the streaming cell). The markdown is printed to stdout as
// well; progress goes to stderr (a bar on a terminal).
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
	fs := flag.NewFlagSet("mwrpcbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		mode        = fs.String("mode", string(bench.ModeTwoProcess), "where servers run: "+string(bench.ModeTwoProcess)+" (a process per system) or "+string(bench.ModeInProcess)+" (this process)")
		quick       = fs.Bool("quick", false, "reduced matrix ("+quickPayloads+"; concurrency "+quickConcurrency+"; shorter rounds): under a minute")
		systems     = fs.String("systems", "all", "systems to run, comma-separated: "+strings.Join(bench.SystemNames(), ","))
		payloads    = fs.String("payloads", fullPayloads, "payload sizes, comma-separated (64, 4KiB, 1MiB ...)")
		concurrency = fs.String("concurrency", fullConcurrency, "concurrent callers per system, comma-separated")
		duration    = fs.Duration("duration", time.Second, "measured time per system per round (-quick: 300ms)")
		warmup      = fs.Duration("warmup", 200*time.Millisecond, "unmeasured time per system per cell, after setup (-quick: 100ms)")
		rounds      = fs.Int("rounds", 3, "rounds per cell; reports show medians across rounds")
		maxInflight = fs.String("max-inflight", "128MiB", "skip cells whose payload × concurrency exceeds this (0: no cap)")
		out         = fs.String("out", "results", "output directory (-quick: results/quick)")
		cpuprofile  = fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (the harness's process: the clients, in two-process mode)")
		serverProf  = fs.String("server-cpuprofile", "", "two-process mode: every server process writes a CPU profile of its life to PREFIX.SYSTEM.CELL.pprof")
		cellsFlag   = fs.String("cells", "echo,stream", "what to run, comma-separated: echo (the matrix of -payloads × -concurrency) and stream (the streaming cell)")
		streamSize  = fs.String("stream-size", fullStream, "bytes per transfer of the streaming cell, each way (-quick: "+quickStream+")")
		streamChunk = fs.String("stream-chunk", "1MiB", "bytes per message of the streaming cell")
		listCells   = fs.Bool("list-cells", false, "print how many echo cells -payloads, -concurrency and -max-inflight make, and exit")
		listSystems = fs.Bool("list-systems", false, "print the systems of the two-process echo matrix that \"all\" runs, one a line, and exit")
		keepGoing   = fs.Bool("keep-going", false, "a system that fails in a cell leaves that cell (the report's notes say why) instead of ending the run")
		cpusFlag    = fs.String("cpus", "", "SERVER/CLIENT CPU lists, as 0-7/8-15 (Linux): server processes run on the first, this process (the clients) on the second, GOMAXPROCS the count of each, so that one many-core machine behaves like two hosts")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mwrpcbench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *listSystems {
		all, _ := bench.LookupSystems("all")
		for _, s := range all {
			if s.TwoProcess() {
				fmt.Fprintln(stdout, s.Name)
			}
		}
		return 0
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		for name, v := range map[string]string{"payloads": quickPayloads, "concurrency": quickConcurrency,
			"duration": "300ms", "warmup": "100ms", "out": filepath.Join("results", "quick"), "stream-size": quickStream} {
			if !set[name] {
				_ = fs.Set(name, v)
			}
		}
	}

	cfg := bench.Config{Duration: *duration, Warmup: *warmup, Rounds: *rounds}
	var err error
	var split bench.CPUSplit
	if *cpusFlag != "" {
		if split, err = bench.ParseCPUSplit(*cpusFlag); err != nil {
			return usage(stderr, fmt.Errorf("-cpus: %w", err))
		}
		if err := bench.PinCPUs(split.Client); err != nil {
			fmt.Fprintln(stderr, "mwrpcbench:", err)
			return 1
		}
		_ = os.Setenv(bench.ServeCPUsEnv, bench.FormatCPUList(split.Server))
	}
	if cfg.Mode, err = bench.ParseMode(*mode); err != nil {
		return usage(stderr, fmt.Errorf("-mode: %w", err))
	}
	runEcho, runStream, err := parseCells(*cellsFlag)
	if err != nil {
		return usage(stderr, fmt.Errorf("-cells: %w", err))
	}
	if cfg.Systems, err = bench.LookupSystems(*systems); err != nil {
		return usage(stderr, err)
	}
	echoSystems, leftOut := cfg.RunSystems()
	streamSystems := cfg.StreamRunSystems()
	notes, err := bench.Notes(echoSystems)
	if err != nil {
		return usage(stderr, fmt.Errorf("-systems: %w", err))
	}
	switch {
	case runEcho && len(echoSystems) == 0 && len(leftOut) > 0:
		return usage(stderr, fmt.Errorf("-systems: %s run in %s mode only", strings.Join(leftOut, ", "), bench.ModeInProcess))
	case runEcho && len(echoSystems) == 0 && runStream && len(streamSystems) > 0:
		runEcho = false // -systems names streaming systems only
	case runEcho && len(echoSystems) == 0:
		return usage(stderr, errors.New("-systems: no system of the echo matrix"))
	}
	switch {
	case runStream && len(streamSystems) == 0 && runEcho:
		runStream = false
		fmt.Fprintf(stderr, "mwrpcbench: no system of -systems streams: no streaming cell\n")
	case runStream && len(streamSystems) == 0:
		return usage(stderr, fmt.Errorf("-systems: no system of the streaming cell (%s)", strings.Join(streamNames(), ", ")))
	}
	streamBytes, err := parseBytes(*streamSize)
	if err != nil || streamBytes <= 0 {
		return usage(stderr, fmt.Errorf("-stream-size: bad size %q", *streamSize))
	}
	if cfg.StreamChunk, err = load.ParseSize(*streamChunk); err != nil || cfg.StreamChunk <= 0 || cfg.StreamChunk > 64<<20 {
		return usage(stderr, fmt.Errorf("-stream-chunk: bad size %q (1 B to 64 MiB)", *streamChunk))
	}
	cfg.StreamBytes = streamBytes
	if cfg.Payloads, err = parseList(*payloads, load.ParseSize); err != nil {
		return usage(stderr, fmt.Errorf("-payloads: %w", err))
	}
	if cfg.Concurrency, err = parseList(*concurrency, strconv.Atoi); err != nil {
		return usage(stderr, fmt.Errorf("-concurrency: %w", err))
	}
	inflight, err := load.ParseSize(*maxInflight)
	if err != nil {
		return usage(stderr, fmt.Errorf("-max-inflight: %w", err))
	}
	cfg.MaxInflight = int64(inflight)
	if cfg.Rounds < 1 || cfg.Duration <= 0 || cfg.Warmup < 0 {
		return usage(stderr, errors.New("-rounds and -duration must be positive, -warmup not negative"))
	}
	cells, skipped := cfg.Cells()
	if *listCells {
		fmt.Fprintln(stdout, len(cells))
		return 0
	}
	if runEcho && len(cells) == 0 {
		return usage(stderr, errors.New("every cell is above -max-inflight"))
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(stderr, "mwrpcbench:", err)
		return 1
	}

	start := time.Now()
	rep := &bench.Report{Machine: bench.ThisMachine(start)}
	rep.Setup = bench.Setup{
		Command:          strings.TrimSpace("mwrpcbench " + strings.Join(args, " ")),
		Source:           bench.Source(),
		LoadAvg:          [2]float64{bench.LoadAvg()},
		Mode:             cfg.Mode,
		Sides:            cfg.Mode.SidesNote(),
		LeftOut:          leftOut,
		Payloads:         cfg.Payloads,
		Concurrency:      cfg.Concurrency,
		DurationNs:       cfg.Duration.Nanoseconds(),
		WarmupNs:         cfg.Warmup.Nanoseconds(),
		Rounds:           cfg.Rounds,
		MaxInflightBytes: cfg.MaxInflight,
		SkippedCells:     []string{},
		Notes:            notes,
	}
	if split.Server != nil {
		rep.Setup.Notes = append(rep.Setup.Notes, fmt.Sprintf("-cpus %s: server processes pinned to CPUs %s (GOMAXPROCS %d), the clients to CPUs %s (GOMAXPROCS %d)",
			split, bench.FormatCPUList(split.Server), len(split.Server), bench.FormatCPUList(split.Client), len(split.Client)))
	}
	if runEcho {
		rep.Setup.Cells = append(rep.Setup.Cells, bench.CellEcho)
		for _, s := range echoSystems {
			rep.Setup.Systems = append(rep.Setup.Systems, bench.SystemInfo{Name: s.Name, Desc: s.Desc})
		}
		for _, c := range skipped {
			rep.Setup.SkippedCells = append(rep.Setup.SkippedCells, c.String())
		}
		fmt.Fprintf(stderr, "mwrpcbench: %s mode: %d cells × %d systems × %d rounds of %v; %s\n",
			cfg.Mode, len(cells), len(echoSystems), cfg.Rounds, cfg.Duration, cfg.Mode.SidesNote())
	} else {
		rep.Setup.Payloads, rep.Setup.Concurrency = nil, nil
		leftOut, skipped, rep.Setup.LeftOut = nil, nil, nil
	}
	if runStream {
		rep.Setup.Cells = append(rep.Setup.Cells, bench.CellStream)
		rep.Setup.StreamBytes, rep.Setup.StreamChunkBytes = cfg.StreamBytes, cfg.StreamChunk
		for _, s := range streamSystems {
			rep.Setup.StreamSystems = append(rep.Setup.StreamSystems, bench.SystemInfo{Name: s.Name, Desc: s.StreamDesc})
		}
		fmt.Fprintf(stderr, "mwrpcbench: %s mode: streaming cell: %d systems × %d rounds × (a server stream and a client stream of %s in %s messages)\n",
			cfg.Mode, len(streamSystems), cfg.Rounds, bench.SizeName64(cfg.StreamBytes), bench.SizeName(cfg.StreamChunk))
	}
	if len(leftOut) > 0 {
		fmt.Fprintf(stderr, "mwrpcbench: skipping %s: in-process only (run it with -mode %s)\n",
			strings.Join(leftOut, ", "), bench.ModeInProcess)
	}
	for _, n := range rep.Setup.Notes {
		fmt.Fprintln(stderr, "mwrpcbench: note:", n)
	}
	if len(skipped) > 0 {
		fmt.Fprintf(stderr, "mwrpcbench: skipping %s (more than %s in flight per direction; see -max-inflight)\n",
			strings.Join(rep.Setup.SkippedCells, ", "), *maxInflight)
	}

	if *cpuprofile != "" {
		stop, err := startCPUProfile(*cpuprofile)
		if err != nil {
			fmt.Fprintln(stderr, "mwrpcbench:", err)
			return 1
		}
		defer stop()
	}
	if *serverProf != "" {
		if cfg.ServerCPUProfile, err = filepath.Abs(*serverProf); err != nil {
			fmt.Fprintln(stderr, "mwrpcbench:", err)
			return 1
		}
	}
	cfg.Progress = bench.NewProgress(stderr, tty, cfg.Rounds)
	if *keepGoing {
		cfg.KeepGoing = true
		cfg.OnFailure = func(cell bench.Cell, system string, err error) {
			line := fmt.Sprintf("%v: %s left the cell: %v", cell, system, err)
			fmt.Fprintln(stderr, "mwrpcbench:", line)
			rep.Setup.Notes = append(rep.Setup.Notes, line)
		}
	}
	if runEcho {
		rep.Results, err = bench.Run(cfg)
	}
	if err == nil && runStream {
		rep.StreamResults, err = bench.RunStreams(cfg)
	}
	rep.Setup.LoadAvg[1] = bench.LoadAvg()
	rep.Setup.WallSeconds = float64(time.Since(start).Round(100*time.Millisecond)) / 1e9
	if err != nil {
		fmt.Fprintln(stderr, "mwrpcbench:", err)
		return 1
	}

	if err := write(rep, *out, stdout); err != nil {
		fmt.Fprintln(stderr, "mwrpcbench:", err)
		return 1
	}
	fmt.Fprintf(stderr, "mwrpcbench: wrote %s/latest.{json,md} and charts in %v\n", *out, time.Since(start).Round(100*time.Millisecond))
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

// startCPUProfile profiles this process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
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
