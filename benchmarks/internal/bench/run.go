package bench

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config is what to run.
type Config struct {
	Systems     []System
	Payloads    []int // bytes
	Concurrency []int // callers per system
	// Duration is how long each system is measured in each round of each cell.
	Duration time.Duration
	// Warmup is how long each system runs, unmeasured, after it is set up for a cell.
	Warmup time.Duration
	// Rounds is how many times each cell is measured per system; the reports show medians.
	Rounds int
	// MaxInflight caps payload × concurrency, the bytes in flight in each direction: cells
	// above it are skipped (and listed as such). Zero means no cap.
	MaxInflight int64
	// Mode says where the servers run; "" is ModeTwoProcess.
	Mode Mode
	// Executable is the program started as a server process in ModeTwoProcess, with
	// ServeFlag (see ServeMain); "" is this program (os.Executable).
	Executable string
	// Progress, if not nil, is told about every measurement.
	Progress Progress
	// ServerCPUProfile, if not "", has every server process (ModeTwoProcess) write a CPU
	// profile of its life to a file named after it (serverProfile).
	ServerCPUProfile string

	// The streaming cell (RunStreams): each system's server streams StreamBytes to its
	// client in messages of StreamChunk bytes, and its client streams as many to it, once
	// per round each (Rounds). Warmup > 0 warms each system up with a transfer of
	// min(StreamBytes, 64 MiB) each way.
	StreamBytes int64
	StreamChunk int

	// KeepGoing, when set, makes a system that fails in a cell (setup, warm-up, a round
	// or teardown) leave that cell only, reported to OnFailure, instead of ending the run:
	// for a run that cannot be repeated (scripts/manycore.sh).
	KeepGoing bool
	// OnFailure, with KeepGoing, is told of each system left out of a cell, and why.
	OnFailure func(cell Cell, system string, err error)
}

// RunSystems returns the systems of the echo matrix the mode runs, and the names of those
// it leaves out (in ModeTwoProcess, the systems that exist only in one process:
// mwrpc-inproc). Systems of the streaming cell only are neither.
func (cfg *Config) RunSystems() (run []System, left []string) {
	for _, s := range cfg.Systems {
		if !s.Echo() {
			continue
		}
		if cfg.Mode != ModeInProcess && !s.TwoProcess() {
			left = append(left, s.Name)
			continue
		}
		run = append(run, s)
	}
	return run, left
}

// Cell is one point of the matrix.
type Cell struct {
	Payload     int
	Concurrency int
}

func (c Cell) String() string { return fmt.Sprintf("%s c%d", SizeName(c.Payload), c.Concurrency) }

// Round is one measurement of one system in one cell.
type Round struct {
	Ops            int64
	Elapsed        time.Duration // from the start signal until the last caller returned
	P50, P99, P999 time.Duration
	Mallocs        uint64 // runtime.MemStats.Mallocs delta: this process (both sides in ModeInProcess)
	AllocBytes     uint64 // runtime.MemStats.TotalAlloc delta
	CPU            time.Duration
	ServerCPU      time.Duration // the server process's, in two-process mode on Linux
	HasServerCPU   bool
	// Waited and ServerWaited are how long the harness's and the server process's threads
	// waited on a CPU run queue during the round (Linux schedstat; the server's in
	// two-process mode only).
	Waited, ServerWaited       time.Duration
	HasWaited, HasServerWaited bool
	Copied                     uint64
	HasCopied                  bool
}

// OpsPerSec is the round's throughput.
func (r Round) OpsPerSec() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

// Cells returns the matrix in the order it runs, and the cells MaxInflight leaves out.
func (cfg *Config) Cells() (run, skipped []Cell) {
	for _, p := range cfg.Payloads {
		for _, c := range cfg.Concurrency {
			cell := Cell{p, c}
			if cfg.MaxInflight > 0 && int64(p)*int64(c) > cfg.MaxInflight {
				skipped = append(skipped, cell)
				continue
			}
			run = append(run, cell)
		}
	}
	return run, skipped
}

// Run measures every system in every cell and returns the results, medians across rounds.
//
// Per cell, every system is set up (in ModeTwoProcess its server process started, its
// client connected; in ModeInProcess server and client in this process), warmed up, then
// measured Rounds times with the systems interleaved: round r runs them in order rotated
// by r (A B C, B C A, ...), so that drift in the machine (other load, frequency, the
// heap) lands on all of them alike. Each measurement starts with a forced GC, so that the
// garbage of the system before is not collected on this one's time. At the end of the cell
// every client is closed and every server stopped (server processes with SIGTERM), also
// when a measurement fails.
func Run(cfg Config) ([]Result, error) {
	cfg.Systems, _ = cfg.RunSystems()
	if cfg.Rounds < 1 || cfg.Duration <= 0 || len(cfg.Systems) == 0 {
		return nil, errors.New("bench: need at least one system the mode can run, one round and a positive duration")
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeTwoProcess
	}
	if cfg.Mode == ModeTwoProcess && cfg.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("bench: the server processes' executable: %w", err)
		}
		cfg.Executable = exe
	}
	cells, _ := cfg.Cells()
	prog := cfg.Progress
	if prog == nil {
		prog = nopProgress{}
	}
	prog.Start(len(cells) * len(cfg.Systems) * cfg.Rounds)
	defer prog.Finish()
	var results []Result
	for _, cell := range cells {
		rounds, err := runCell(cfg, cell, prog)
		if err != nil {
			return results, fmt.Errorf("%v: %w", cell, err)
		}
		for i, s := range cfg.Systems {
			if len(rounds[i]) == cfg.Rounds { // all of them, or the system left the cell
				results = append(results, summarize(s.Name, cell, rounds[i]))
			}
		}
	}
	return results, nil
}

// leave takes system i out of cell after err (Config.KeepGoing), closing its instance,
// or returns err to end the run.
func (cfg *Config) leave(cell Cell, runners []*runner, i int, err error) error {
	if !cfg.KeepGoing {
		return err
	}
	if r := runners[i]; r != nil {
		_ = r.inst.Close()
		runners[i] = nil
	}
	if cfg.OnFailure != nil {
		cfg.OnFailure(cell, cfg.Systems[i].Name, err)
	}
	return nil
}

// runner is one system set up for one cell, with its callers' latency buffers.
type runner struct {
	sys  System
	inst Instance
	lat  [][]time.Duration // per caller, reused across rounds
	all  []time.Duration
}

func runCell(cfg Config, cell Cell, prog Progress) ([][]Round, error) {
	runners := make([]*runner, len(cfg.Systems))
	defer func() {
		for _, r := range runners {
			if r != nil {
				_ = r.inst.Close()
			}
		}
	}()
	for i, s := range cfg.Systems {
		var inst Instance
		var err error
		if cfg.Mode == ModeInProcess {
			inst, err = openLocal(s, cell.Payload, cell.Concurrency)
		} else {
			inst, err = openRemote(cfg.Executable, s, cell.Payload, cell.Concurrency, serverProfile(cfg, s.Name, CellEcho, cell))
		}
		if err != nil {
			if err := cfg.leave(cell, runners, i, fmt.Errorf("%s: setup: %w", s.Name, err)); err != nil {
				return nil, err
			}
			continue
		}
		runners[i] = &runner{sys: s, inst: inst, lat: make([][]time.Duration, cell.Concurrency)}
	}
	for i, r := range runners {
		if r != nil && cfg.Warmup > 0 {
			prog.Warmup(cell, r.sys.Name)
			w, err := r.measure(cell.Concurrency, cfg.Warmup)
			if err != nil {
				if err := cfg.leave(cell, runners, i, fmt.Errorf("%s: warm-up: %w", r.sys.Name, err)); err != nil {
					return nil, err
				}
				continue
			}
			r.reserve(w, cfg.Duration)
		}
	}
	rounds := make([][]Round, len(runners))
	for round := range cfg.Rounds {
		for k := range runners {
			i := (k + round) % len(runners)
			r := runners[i]
			if r == nil {
				continue
			}
			prog.Begin(cell, round, r.sys.Name)
			res, err := r.measure(cell.Concurrency, cfg.Duration)
			if err != nil {
				rounds[i] = nil
				if err := cfg.leave(cell, runners, i, fmt.Errorf("%s: round %d: %w", r.sys.Name, round+1, err)); err != nil {
					return nil, err
				}
				continue
			}
			rounds[i] = append(rounds[i], res)
			prog.End(cell, round, r.sys.Name, res)
		}
	}
	for i, r := range runners {
		if r == nil {
			continue
		}
		runners[i] = nil
		if err := r.inst.Close(); err != nil {
			rounds[i] = nil
			if err := cfg.leave(cell, runners, i, fmt.Errorf("%s: teardown: %w", r.sys.Name, err)); err != nil {
				return nil, err
			}
		}
	}
	return rounds, nil
}

// reserve sizes the latency buffers for a measurement of d, from the rate of warm-up w, so
// that recording latencies does not allocate while allocations are being counted.
func (r *runner) reserve(w Round, d time.Duration) {
	if w.Ops == 0 || w.Elapsed <= 0 {
		return
	}
	per := int(2*w.OpsPerSec()*d.Seconds())/len(r.lat) + 64
	for i := range r.lat {
		r.lat[i] = slices.Grow(r.lat[i][:0], per)
	}
}

// measure runs conc callers for d and reads the counters around them.
func (r *runner) measure(conc int, d time.Duration) (Round, error) {
	var (
		start = make(chan struct{})
		stop  atomic.Bool
		wg    sync.WaitGroup
		errs  = make([]error, conc)
	)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := r.lat[w][:0]
			<-start
			for !stop.Load() {
				t0 := time.Now()
				if err := r.inst.Call(w); err != nil {
					errs[w] = err
					stop.Store(true)
					break
				}
				lat = append(lat, time.Since(t0))
			}
			r.lat[w] = lat
		}()
	}
	// The run-queue waits read every thread's /proc file, which allocates: they are read
	// outside the window where this process's allocations are counted, so that allocs/op
	// is the calls' own (at 1 MiB and one caller, a round has a few hundred calls).
	waits0 := readWaits(r.inst)
	runtime.GC()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	copied0, hasCopied := r.inst.Copied()
	cpu0 := selfCPU()
	scpu0, hasSCPU := serverCPU(r.inst)
	t0 := time.Now()
	close(start)
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(t0)
	cpu1 := selfCPU()
	scpu1, hasSCPU1 := serverCPU(r.inst)
	copied1, _ := r.inst.Copied()
	runtime.ReadMemStats(&ms1)
	waits1 := readWaits(r.inst)
	if err := errors.Join(errs...); err != nil {
		return Round{}, err
	}

	r.all = r.all[:0]
	for _, l := range r.lat {
		r.all = append(r.all, l...)
	}
	slices.Sort(r.all)
	res := Round{
		Ops:        int64(len(r.all)),
		Elapsed:    elapsed,
		P50:        quantile(r.all, 500),
		P99:        quantile(r.all, 990),
		P999:       quantile(r.all, 999),
		Mallocs:    ms1.Mallocs - ms0.Mallocs,
		AllocBytes: ms1.TotalAlloc - ms0.TotalAlloc,
		CPU:        cpu1 - cpu0,
		Copied:     copied1 - copied0,
		HasCopied:  hasCopied,
	}
	if hasSCPU && hasSCPU1 {
		res.ServerCPU, res.HasServerCPU = scpu1-scpu0, true
	}
	waits0.since(waits1, &res)
	if res.Ops == 0 {
		return res, fmt.Errorf("no call completed in %v", d)
	}
	return res, nil
}

// serverCPU returns the CPU time of inst's server process, if it has one and it is known.
func serverCPU(inst Instance) (time.Duration, bool) {
	if s, ok := inst.(interface{ ServerCPU() (time.Duration, bool) }); ok {
		return s.ServerCPU()
	}
	return 0, false
}

// runQueueWaits is how long the harness's and the server process's threads had waited
// for a CPU at one instant (has*: known on this OS and mode).
type runQueueWaits struct {
	self, server       time.Duration
	hasSelf, hasServer bool
}

// readWaits reads the harness's and inst's server's run-queue waits.
func readWaits(inst Instance) runQueueWaits {
	var w runQueueWaits
	w.self, w.hasSelf = processRunQueueWait(os.Getpid())
	w.server, w.hasServer = serverRunQueueWait(inst)
	return w
}

// since sets res's waits to what was waited between w and later.
func (w runQueueWaits) since(later runQueueWaits, res *Round) {
	if w.hasSelf && later.hasSelf {
		res.Waited, res.HasWaited = max(later.self-w.self, 0), true
	}
	if w.hasServer && later.hasServer {
		res.ServerWaited, res.HasServerWaited = max(later.server-w.server, 0), true
	}
}

// serverRunQueueWait returns how long inst's server process has waited for a CPU so far,
// if it has one and that is known.
func serverRunQueueWait(inst Instance) (time.Duration, bool) {
	if s, ok := inst.(interface{ ServerRunQueueWait() (time.Duration, bool) }); ok {
		return s.ServerRunQueueWait()
	}
	return 0, false
}

// quantile returns the nearest-rank quantile of sorted for q per mille: the smallest
// sample with at least q/1000 of the samples at or below it.
func quantile(sorted []time.Duration, q int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (len(sorted)*q + 999) / 1000 // ceil(n q / 1000), in integers
	return sorted[min(max(rank, 1), len(sorted))-1]
}
