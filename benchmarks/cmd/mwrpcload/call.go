package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/load"
	"github.com/mwrpc/mwrpc/rpc"
)

// Summary is what call prints: how every call ended, and what the client holds after.
type Summary struct {
	Calls      int64            `json:"calls"`
	OK         int64            `json:"ok"`
	Failed     map[string]int64 `json:"failed"`     // by status code name
	Mismatched int64            `json:"mismatched"` // responses that were not their call's echo
	// Hung counts calls still running HangBound after their deadline: they are abandoned
	// (the process exits with them).
	Hung       int64   `json:"hung"`
	MaxCallMs  float64 `json:"max_call_ms"` // the longest call, against
	DeadlineMs float64 `json:"deadline_ms"` // the calls' deadline
	// RecoverMs is the time from the heal notice (a line "heal" on stdin) to the first
	// call that succeeded after it; -1 when no heal was told, or none succeeded.
	RecoverMs float64 `json:"recover_ms"`
	// What the client holds once the calls have ended and it has closed: windows still
	// exposed just before Close, and goroutines above the count before Dial.
	WindowsExposedAfter int `json:"windows_exposed_after"`
	GoroutinesLeaked    int `json:"goroutines_leaked"`
}

// HangBound is how long past its deadline a call may take before it counts as hung: a
// call ends when its context does, give or take scheduling and the transport's cancel.
const HangBound = 2 * time.Second

// call runs -callers callers against -target for -duration, each call with -deadline,
// cycling through -sizes, and prints a Summary.
func call(args []string) error {
	fs := flag.NewFlagSet("call", flag.ExitOnError)
	target := fs.String("target", "127.0.0.1:7000", "server address")
	dev := fs.String("device", "", "RDMA device (ibv provider); empty: the soft TCP fabric")
	duration := fs.Duration("duration", 10*time.Second, "how long to keep calling (bounded: calls stop by themselves)")
	maxCalls := fs.Int64("max-calls", 0, "stop after this many calls (0: only -duration bounds them)")
	deadline := fs.Duration("deadline", 2*time.Second, "each call's deadline")
	sizeList := fs.String("sizes", "64,64KiB,1MiB", "request sizes, in turn")
	callers := fs.Int("callers", 4, "concurrent callers")
	afterHeal := fs.Duration("after-heal", 0, "keep calling at least this long after the heal notice (0: -duration alone)")
	untilHeal := fs.Bool("until-heal", false, "stop -after-heal past the heal notice, not at -duration (which still bounds the run)")
	delay := fs.Duration("delay", 0, "how long the server holds each call (calls are mid-flight when a fault strikes)")
	backoff := fs.Duration("backoff-max", time.Second, "the reconnection backoff's ceiling")
	keepalive := fs.Duration("keepalive-timeout", 3*time.Second, "drop a connection whose ping (every second without a response) gets no answer in this")
	_ = fs.Parse(args)
	sizes, err := load.ParseSizes(*sizeList)
	if err != nil {
		return err
	}
	d, done, err := withDevice(*dev)
	if err != nil {
		return err
	}
	defer done()

	healed := make(chan struct{}, 1)
	go watchHeal(healed) // before base: it may wait on stdin for the whole process
	base := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), *duration+*deadline)
	defer cancel()
	client, err := rpc.Dial(ctx, *target, dialOptions(d, rpc.WithBackoff(50*time.Millisecond, *backoff),
		rpc.WithKeepalive(time.Second, *keepalive))...)
	if err != nil {
		return err
	}
	svc := load.NewLoadClient(client)

	var (
		sum       = Summary{Failed: map[string]int64{}, DeadlineMs: ms(*deadline), RecoverMs: -1}
		mu        sync.Mutex
		maxCall   time.Duration
		healAt    atomic.Int64 // unix nanos of the heal signal, 0 before
		recovered atomic.Int64 // unix nanos of the first success after it
		nextID    atomic.Uint64
		inCall    atomic.Int64 // callers inside a call now
		running   sync.WaitGroup
	)
	var endAt atomic.Int64 // unix nanos when calls stop; a heal may move it later
	bound := time.Now().Add(*duration)
	endAt.Store(bound.UnixNano())
	stopHeal := make(chan struct{})
	go func() {
		select {
		case <-healed:
			now := time.Now()
			healAt.Store(now.UnixNano())
			// A heal told late (a slow machine) still leaves time to see service resume.
			if e := now.Add(*afterHeal).UnixNano(); e > endAt.Load() || *untilHeal {
				endAt.Store(min(e, bound.UnixNano()))
			}
		case <-stopHeal:
		}
	}()
	for c := 0; c < *callers; c++ {
		running.Add(1)
		go func() {
			defer running.Done()
			for i := c; time.Now().UnixNano() < endAt.Load() && (*maxCalls == 0 || nextID.Load() < uint64(*maxCalls)); i++ {
				req := make([]byte, sizes[i%len(sizes)])
				if len(req) < load.RequestHeader {
					req = make([]byte, load.RequestHeader)
				}
				load.Request(req, nextID.Add(1), *delay)
				cctx, ccancel := context.WithTimeout(context.Background(), *deadline)
				t0 := time.Now()
				inCall.Add(1)
				resp, err := svc.Echo(cctx, req)
				inCall.Add(-1)
				took := time.Since(t0)
				ccancel()
				if err == nil {
					err = load.Check(req, resp)
				}
				mu.Lock()
				sum.Calls++
				maxCall = max(maxCall, took)
				switch {
				case err == nil:
					sum.OK++
					if h := healAt.Load(); h != 0 && t0.UnixNano() >= h {
						recovered.CompareAndSwap(0, time.Now().UnixNano())
					}
				case errors.Is(err, load.ErrMismatch):
					sum.Mismatched++
				default:
					sum.Failed[rpc.CodeOf(err).String()]++
				}
				mu.Unlock()
				if err != nil && took < 10*time.Millisecond {
					time.Sleep(10 * time.Millisecond) // a fast failure (no connection): do not spin
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { running.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-untilPast(&endAt, *deadline+HangBound, finished):
		// Calls that outlived their deadline by HangBound are hung (each caller has at
		// most one call out).
		mu.Lock()
		sum.Hung = inCall.Load()
		mu.Unlock()
	}
	mu.Lock()
	sum.MaxCallMs = ms(maxCall)
	mu.Unlock()
	if h, r := healAt.Load(), recovered.Load(); h != 0 && r != 0 {
		sum.RecoverMs = ms(time.Duration(r - h))
	}
	if sum.Hung == 0 {
		// The client's own windows (large requests) are revoked by the responses, or
		// released when a connection fails: wait for that, boundedly.
		for wait := time.Now().Add(5 * time.Second); client.Stats().WindowsExposed > 0 && time.Now().Before(wait); {
			time.Sleep(10 * time.Millisecond)
		}
		sum.WindowsExposedAfter = client.Stats().WindowsExposed
		_ = client.Close()
		close(stopHeal)
		for wait := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > base && time.Now().Before(wait); {
			time.Sleep(10 * time.Millisecond)
		}
		sum.GoroutinesLeaked = max(0, runtime.NumGoroutine()-base)
	}
	enc := json.NewEncoder(os.Stdout)
	return enc.Encode(sum)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// untilPast returns a channel closed once the time in end (unix nanos, which may move
// later meanwhile) plus d has passed; it stops watching when done is closed.
func untilPast(end *atomic.Int64, d time.Duration, done <-chan struct{}) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		for {
			left := time.Until(time.Unix(0, end.Load()).Add(d))
			if left <= 0 {
				close(c)
				return
			}
			select {
			case <-done:
				return
			case <-time.After(min(left, 100*time.Millisecond)):
			}
		}
	}()
	return c
}
