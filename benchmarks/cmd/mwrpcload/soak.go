package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/mwrpc/mwrpc/benchmarks/internal/load"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// Sample is the server's state at one moment of the soak.
type Sample struct {
	Seconds float64 `json:"seconds"`
	load.Stats
}

// SoakResult is what the soak writes to soak.json.
type SoakResult struct {
	Fabric          string  `json:"fabric"` // tcp or shm
	Lanes           int     `json:"lanes"`  // each caller's (0: the adaptive default)
	Calls           uint64  `json:"calls"`  // served by the server
	Seconds         float64 `json:"seconds"`
	Kills           int     `json:"client_kills"`
	RSSStart        int64   `json:"rss_start"`
	RSSWarm         int64   `json:"rss_after_warmup"`
	RSSEnd          int64   `json:"rss_end"`
	GoroutinesStart int     `json:"goroutines_start"`
	GoroutinesEnd   int     `json:"goroutines_end"`
	WindowsEnd      int     `json:"windows_exposed_end"`
	GrantsEnd       int     `json:"grants_end"`
	PoolInUseStart  int     `json:"pool_in_use_start"` // the stats connection's own slots
	PoolInUseEnd    int     `json:"pool_in_use_end"`
	Reclaimed       uint64  `json:"windows_reclaimed"`
	MaxConns        int     `json:"max_conns"` // the most connections the server held at a sample
	// Descriptors and memfd mappings beyond the server's pool slabs (load.Stats.PeerFDs,
	// PeerMaps): sockets, and over shm rings, doorbells and peers' regions.
	PeerFDsStart  int      `json:"peer_fds_start"`
	PeerFDsEnd    int      `json:"peer_fds_end"`
	PeerMapsStart int      `json:"peer_maps_start"`
	PeerMapsEnd   int      `json:"peer_maps_end"`
	Problems      []string `json:"problems"` // what failed the soak's checks; empty: passed
	Samples       []Sample `json:"samples"`
}

// soak runs a server and -clients callers as processes of this program until the server
// has served -calls calls (or -max-time passes), SIGKILLs a random caller every
// -kill-every and starts a new one, samples the server each second, and checks at the end
// that nothing leaked. It writes soak.json, soak.csv and soak.png into -out and fails when
// a check does.
func soak(args []string) error {
	fs := flag.NewFlagSet("soak", flag.ExitOnError)
	calls := fs.Uint64("calls", 1_000_000, "calls to serve in all")
	clients := fs.Int("clients", 8, "caller processes")
	killEvery := fs.Duration("kill-every", 3*time.Second, "SIGKILL one caller and start another this often")
	maxTime := fs.Duration("max-time", 15*time.Minute, "stop by then whatever the count")
	warmup := fs.Float64("warmup", 0.3, "the fraction of -calls after which RSS has settled: the reference for the end (the pool grows to the peak of large messages in flight, the heap to its GC target)")
	sizes := fs.String("sizes", "64,64,64,4KiB,4KiB,64KiB,1MiB", "request sizes, in turn")
	fabric := fs.String("fabric", "tcp", "tcp (soft TCP on loopback) or shm (the same host's shm fabric)")
	lanes := fs.Int("lanes", 0, "connections of each caller process to the server (rpc.WithLanes); 0: the adaptive default")
	out := fs.String("out", "results/soak", "output directory")
	_ = fs.Parse(args)
	listen, err := soakListen(*fabric)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	srv, addr, err := startSoakServer(self, listen)
	if err != nil {
		return err
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		if path, ok := shm.ParseTarget(listen); ok {
			_ = os.Remove(path) // a killed server leaves its socket behind
		}
	}()
	r := &soakRun{self: self, addr: addr, sizes: *sizes, lanes: *lanes, maxTime: *maxTime,
		res: SoakResult{Fabric: *fabric, Lanes: *lanes}}
	begin := time.Now()
	first, err := r.sample() // before any caller: the sampling connection's own slots
	if err != nil {
		return err
	}
	r.res.RSSStart, r.res.GoroutinesStart = first.RSSBytes, first.Goroutines
	r.res.Samples = append(r.res.Samples, Sample{Stats: *first})
	r.callers = make([]*exec.Cmd, *clients)
	for i := range r.callers {
		r.callers[i] = r.startCaller()
	}
	defer r.stopCallers()
	if err := r.run(begin, *calls, *killEvery, *warmup); err != nil {
		return err
	}
	r.stopCallers()
	end, err := r.settle(first)
	if err != nil {
		return err
	}
	r.finish(begin, first, end)
	return r.report(*out)
}

// soakListen is where the soak's server listens on fabric: a loopback port of its
// choosing, or a socket in the system's temporary directory named after this process.
func soakListen(fabric string) (string, error) {
	switch fabric {
	case "tcp":
		return "127.0.0.1:0", nil
	case "shm":
		if runtime.GOOS != "linux" {
			return "", fmt.Errorf("-fabric shm: the shm fabric is Linux's alone, not %s's", runtime.GOOS)
		}
		return shm.Scheme + filepath.Join(os.TempDir(), fmt.Sprintf("mwrpcload-soak-%d.sock", os.Getpid())), nil
	}
	return "", fmt.Errorf("-fabric %q: want tcp or shm", fabric)
}

// startSoakServer starts `self serve` listening at listen and returns it with the target
// it says it listens at.
func startSoakServer(self, listen string) (*exec.Cmd, string, error) {
	srv := exec.Command(self, "serve", "-listen", listen)
	srv.Stderr = os.Stderr
	srv.SysProcAttr = childSysProcAttr()
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := srv.Start(); err != nil {
		return nil, "", err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		return nil, "", fmt.Errorf("the server did not say where it listens: %q %v", line, err)
	}
	return srv, addr, nil
}

// soakRun is one soak: the server's address, the caller processes and the result.
type soakRun struct {
	self, addr, sizes string
	lanes             int // each caller's, passed on as call's -lanes
	maxTime           time.Duration
	callers           []*exec.Cmd // nil entries: a caller that did not start
	res               SoakResult
}

// startCaller starts a caller process (`self call`), or returns nil (and says so).
func (r *soakRun) startCaller() *exec.Cmd {
	c := exec.Command(r.self, "call", "-target", r.addr, "-duration", r.maxTime.String(), "-deadline", "5s",
		"-callers", "2", "-sizes", r.sizes, "-lanes", strconv.Itoa(r.lanes))
	c.SysProcAttr = childSysProcAttr()
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "mwrpcload soak: starting a caller:", err)
		return nil
	}
	return c
}

// stopCallers kills every caller process and waits for it.
func (r *soakRun) stopCallers() {
	for _, c := range r.callers {
		if c != nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	r.callers = nil
}

// sample asks the server for its state.
func (r *soakRun) sample() (*load.Stats, error) {
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return serverStats(sctx, r.addr, nil)
}

// run samples the server every second and kills a random caller (starting another) every
// killEvery, until the server has served calls or the soak's time is up.
func (r *soakRun) run(begin time.Time, calls uint64, killEvery time.Duration, warmup float64) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	kill := time.NewTicker(killEvery)
	defer kill.Stop()
	deadline := time.After(r.maxTime)
	var last *load.Stats
	for {
		select {
		case <-tick.C:
			st, err := r.sample()
			if err != nil {
				return fmt.Errorf("sampling the server: %w", err)
			}
			last = st
			r.res.MaxConns = max(r.res.MaxConns, st.Conns)
			r.res.Samples = append(r.res.Samples, Sample{Seconds: time.Since(begin).Seconds(), Stats: *st})
			if r.res.RSSWarm == 0 && float64(st.Served) >= warmup*float64(calls) {
				r.res.RSSWarm = st.RSSBytes
			}
			fmt.Fprintf(os.Stderr, "soak: %5.0fs %9d calls, RSS %6.1f MiB, %4d goroutines, %2d windows, %2d grants, %d conns, %d fds, %d memfd maps\n",
				time.Since(begin).Seconds(), st.Served, float64(st.RSSBytes)/(1<<20), st.Goroutines, st.WindowsExposed, st.Grants, st.Conns, st.FDs, st.MemfdMaps)
			if st.Served >= calls {
				return nil
			}
		case <-kill.C:
			i := rand.N(len(r.callers))
			if c := r.callers[i]; c != nil {
				_ = c.Process.Kill() // mid-call: SIGKILL, no goodbye
				_ = c.Wait()
			}
			r.callers[i] = r.startCaller()
			r.res.Kills++
		case <-deadline:
			r.res.Problems = append(r.res.Problems, fmt.Sprintf("only %d of %d calls in %v", last.Served, calls, r.maxTime))
			return nil
		}
	}
}

// settle waits (30 s at most), every caller gone, for the server's connections to close
// and what they held to return; it returns the last sample.
func (r *soakRun) settle(first *load.Stats) (*load.Stats, error) {
	for wait := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		end, err := r.sample()
		if err != nil {
			return nil, err
		}
		if end.Conns <= 1 && len(leftBehind(first, end)) == 0 || time.Now().After(wait) {
			return end, nil
		}
	}
}

// leftBehind says what the server holds at end beyond what it held at first, which settle
// waits to see go and finish counts as the soak's failures: windows bound, grants given,
// pooled buffers, descriptors and memfd mappings beyond its pool's slabs, and more than 2
// goroutines.
func leftBehind(first, end *load.Stats) []string {
	var held []string
	if end.WindowsExposed != 0 {
		held = append(held, fmt.Sprintf("%d windows still bound", end.WindowsExposed))
	}
	if end.Grants != 0 {
		held = append(held, fmt.Sprintf("%d grants still given", end.Grants))
	}
	if end.PoolInUse > first.PoolInUse {
		held = append(held, fmt.Sprintf("%d pooled buffers held, %d at the start", end.PoolInUse, first.PoolInUse))
	}
	if end.PeerFDs() > first.PeerFDs() || end.PeerMaps() > first.PeerMaps() {
		held = append(held, fmt.Sprintf("%d descriptors and %d memfd mappings beyond the pool's slabs, %d and %d at the start",
			end.PeerFDs(), end.PeerMaps(), first.PeerFDs(), first.PeerMaps()))
	}
	if end.Goroutines > first.Goroutines+2 {
		held = append(held, fmt.Sprintf("%d goroutines, %d at the start", end.Goroutines, first.Goroutines))
	}
	return held
}

// finish records the end of the soak against its start, and what failed its checks.
func (r *soakRun) finish(begin time.Time, first, end *load.Stats) {
	res := &r.res
	res.Calls, res.Seconds = end.Served, time.Since(begin).Seconds()
	res.RSSEnd, res.GoroutinesEnd, res.WindowsEnd, res.GrantsEnd = end.RSSBytes, end.Goroutines, end.WindowsExposed, end.Grants
	res.PoolInUseStart, res.PoolInUseEnd, res.Reclaimed = first.PoolInUse, end.PoolInUse, end.Reclaimed
	res.PeerFDsStart, res.PeerMapsStart = first.PeerFDs(), first.PeerMaps()
	res.PeerFDsEnd, res.PeerMapsEnd = end.PeerFDs(), end.PeerMaps()
	res.Samples = append(res.Samples, Sample{Seconds: res.Seconds, Stats: *end})
	res.Problems = append(res.Problems, leftBehind(first, end)...)
	if res.RSSWarm > 0 && float64(end.RSSBytes) > 1.1*float64(res.RSSWarm) {
		res.Problems = append(res.Problems, fmt.Sprintf("RSS %d bytes, more than 10%% over %d after warm-up", end.RSSBytes, res.RSSWarm))
	}
}

// report writes the soak's files into out and says how it went; it fails when a check did.
func (r *soakRun) report(out string) error {
	res := &r.res
	if err := writeSoak(out, res); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "soak: %s, lanes %s: %d calls in %.0f s, %d callers killed, at most %d connections; RSS %.1f MiB at start, %.1f after warm-up, %.1f at the end; goroutines %d -> %d; windows bound and grants given at the end %d, %d; pooled buffers %d -> %d; descriptors and memfd mappings beyond the pool %d, %d -> %d, %d\n",
		res.Fabric, lanesName(res.Lanes), res.Calls, res.Seconds, res.Kills, res.MaxConns, mib(res.RSSStart), mib(res.RSSWarm), mib(res.RSSEnd),
		res.GoroutinesStart, res.GoroutinesEnd, res.WindowsEnd, res.GrantsEnd, res.PoolInUseStart, res.PoolInUseEnd,
		res.PeerFDsStart, res.PeerMapsStart, res.PeerFDsEnd, res.PeerMapsEnd)
	if len(res.Problems) > 0 {
		return fmt.Errorf("soak failed: %s", strings.Join(res.Problems, "; "))
	}
	fmt.Fprintf(os.Stderr, "soak: passed; %s\n", filepath.Join(out, "soak.png"))
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// lanesName is how a soak names its callers' lanes: a count, or "adaptive" for 0.
func lanesName(n int) string {
	if n == 0 {
		return "adaptive"
	}
	return strconv.Itoa(n)
}

// writeSoak writes soak.json, soak.csv and soak.png (RSS, goroutines and connections over
// time).
func writeSoak(dir string, res *SoakResult) error {
	j, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.json"), j, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "soak.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"seconds", "served", "rss_bytes", "goroutines", "conns", "windows_exposed", "grants", "pool_in_use", "fds", "memfd_maps"})
	for _, s := range res.Samples {
		_ = w.Write([]string{strconv.FormatFloat(s.Seconds, 'f', 1, 64), strconv.FormatUint(s.Served, 10),
			strconv.FormatInt(s.RSSBytes, 10), strconv.Itoa(s.Goroutines), strconv.Itoa(s.Conns),
			strconv.Itoa(s.WindowsExposed), strconv.Itoa(s.Grants), strconv.Itoa(s.PoolInUse), strconv.Itoa(s.FDs), strconv.Itoa(s.MemfdMaps)})
	}
	w.Flush()
	if err := errors.Join(w.Error(), f.Close()); err != nil {
		return err
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("mwrpc soak over %s, lanes %s: %d calls, %d callers killed (server process)", res.Fabric, lanesName(res.Lanes), res.Calls, res.Kills)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "RSS (MiB) / goroutines / connections"
	p.Add(plotter.NewGrid())
	rss, gor, conns := make(plotter.XYs, len(res.Samples)), make(plotter.XYs, len(res.Samples)), make(plotter.XYs, len(res.Samples))
	for i, s := range res.Samples {
		rss[i] = plotter.XY{X: s.Seconds, Y: mib(s.RSSBytes)}
		gor[i] = plotter.XY{X: s.Seconds, Y: float64(s.Goroutines)}
		conns[i] = plotter.XY{X: s.Seconds, Y: float64(s.Conns)}
	}
	for _, l := range []struct {
		name string
		xys  plotter.XYs
		dash []vg.Length // nil: solid
	}{{"RSS (MiB)", rss, nil}, {"goroutines", gor, []vg.Length{vg.Points(4), vg.Points(3)}}, {"connections", conns, []vg.Length{vg.Points(1), vg.Points(2)}}} {
		line, err := plotter.NewLine(l.xys)
		if err != nil {
			return err
		}
		line.Width = vg.Points(1.5)
		line.Dashes = l.dash
		p.Add(line)
		p.Legend.Add(l.name, line)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	return p.Save(8*vg.Inch, 4*vg.Inch, filepath.Join(dir, "soak.png"))
}
