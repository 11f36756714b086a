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
	// CloseError is what Client.Close returned, if anything: a pooled buffer never
	// returned to the client's pool is a pool.LeakError there.
	CloseError string `json:"close_error,omitempty"`
	// ReleaseFailed counts lent responses (-lent) that Client.Release refused.
	ReleaseFailed int64 `json:"release_failed"`
}

// HangBound is how long past its deadline a call may take before it counts as hung: a
// call ends when its context does, give or take scheduling and the transport's cancel.
const HangBound = 2 * time.Second

// call runs -callers callers against -target for -duration, each call with -deadline,
// cycling through -sizes, and prints a Summary.
func call(args []string) error {
	fs := flag.NewFlagSet("call", flag.ExitOnError)
	target := fs.String("target", "127.0.0.1:7000", "server address: host:port, or shm:///path/to.sock")
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
	lanes := fs.Int("lanes", 0, "connections to the server (rpc.WithLanes); 0: as many as the client's adaptive default opens")
	lent := fs.Bool("lent", false, "build each request in the client's registered memory (rpc.Client.Buffer) and take each response lent (rpc.WithLentResponses), released once checked")
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
	opts := []rpc.DialOption{rpc.WithBackoff(50*time.Millisecond, *backoff), rpc.WithKeepalive(time.Second, *keepalive)}
	if *lanes > 0 {
		opts = append(opts, rpc.WithLanes(*lanes))
	}
	if *lent {
		opts = append(opts, rpc.WithLentResponses())
	}
	client, err := rpc.Dial(ctx, *target, dialOptions(d, opts...)...)
	if err != nil {
		return err
	}
	r := &callRun{client: client, lent: *lent, svc: load.NewLoadClient(client), sizes: sizes, deadline: *deadline, delay: *delay, maxCalls: *maxCalls,
		sum: Summary{Failed: map[string]int64{}, DeadlineMs: ms(*deadline), RecoverMs: -1}}
	bound := time.Now().Add(*duration)
	r.endAt.Store(bound.UnixNano())
	stopHeal := make(chan struct{})
	go r.onHeal(healed, stopHeal, bound, *afterHeal, *untilHeal)
	var running sync.WaitGroup
	for c := 0; c < *callers; c++ {
		running.Add(1)
		go func() {
			defer running.Done()
			r.caller(c)
		}()
	}
	r.wait(&running)
	if r.sum.Hung == 0 {
		r.closeClient(client, base, stopHeal)
	}
	return json.NewEncoder(os.Stdout).Encode(r.sum)
}

// callRun is one run of call: its callers' shared counts and bounds.
type callRun struct {
	client   *rpc.Client
	lent     bool // requests built in client.Buffer, responses lent
	svc      *load.LoadClient
	sizes    []int
	deadline time.Duration // each call's
	delay    time.Duration // how long the server holds each call
	maxCalls int64

	mu      sync.Mutex // sum and maxCall
	sum     Summary
	maxCall time.Duration

	endAt     atomic.Int64 // unix nanos when calls stop; a heal may move it later
	healAt    atomic.Int64 // unix nanos of the heal signal, 0 before
	recovered atomic.Int64 // unix nanos of the first success after it
	nextID    atomic.Uint64
	inCall    atomic.Int64 // callers inside a call now
}

// onHeal records the heal notice when it comes, and moves the end of the run to
// afterHeal past it (within bound) where that is later, or always with untilHeal.
func (r *callRun) onHeal(healed, stop <-chan struct{}, bound time.Time, afterHeal time.Duration, untilHeal bool) {
	select {
	case <-healed:
		now := time.Now()
		r.healAt.Store(now.UnixNano())
		// A heal told late (a slow machine) still leaves time to see service resume.
		if e := now.Add(afterHeal).UnixNano(); e > r.endAt.Load() || untilHeal {
			r.endAt.Store(min(e, bound.UnixNano()))
		}
	case <-stop:
	}
}

// caller is caller c: it calls until the run ends (or -max-calls), its sizes in turn
// from its own place in the list, and records how each call ended.
func (r *callRun) caller(c int) {
	for i := c; time.Now().UnixNano() < r.endAt.Load() && (r.maxCalls == 0 || r.nextID.Load() < uint64(r.maxCalls)); i++ {
		req := make([]byte, r.sizes[i%len(r.sizes)])
		if len(req) < load.RequestHeader {
			req = make([]byte, load.RequestHeader)
		}
		load.Request(req, r.nextID.Add(1), r.delay)
		cctx, ccancel := context.WithTimeout(context.Background(), r.deadline)
		t0 := time.Now()
		r.inCall.Add(1)
		resp, err := r.echo(cctx, req)
		r.inCall.Add(-1)
		took := time.Since(t0)
		ccancel()
		if err == nil {
			err = load.Check(req, resp)
			r.release(resp)
		}
		r.record(err, t0, took)
		if err != nil && took < 10*time.Millisecond {
			time.Sleep(10 * time.Millisecond) // a fast failure (no connection): do not spin
		}
	}
}

// echo calls Echo with req: as it is, or with -lent a copy of it built in the client's
// registered memory, which the call takes (req stays the caller's, to check the response
// against).
func (r *callRun) echo(ctx context.Context, req []byte) ([]byte, error) {
	if !r.lent {
		return r.svc.Echo(ctx, req)
	}
	buf, err := r.client.Buffer(ctx, len(req))
	if err != nil {
		return nil, err
	}
	copy(buf, req)
	return r.svc.Echo(ctx, buf)
}

// release gives a lent response back (-lent), counting a refusal.
func (r *callRun) release(resp []byte) {
	if !r.lent {
		return
	}
	if err := r.client.Release(resp); err != nil {
		r.mu.Lock()
		r.sum.ReleaseFailed++
		r.mu.Unlock()
	}
}

// record counts how a call that started at t0 and took took ended.
func (r *callRun) record(err error, t0 time.Time, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sum.Calls++
	r.maxCall = max(r.maxCall, took)
	switch {
	case err == nil:
		r.sum.OK++
		if h := r.healAt.Load(); h != 0 && t0.UnixNano() >= h {
			r.recovered.CompareAndSwap(0, time.Now().UnixNano())
		}
	case errors.Is(err, load.ErrMismatch):
		r.sum.Mismatched++
	default:
		r.sum.Failed[rpc.CodeOf(err).String()]++
	}
}

// wait waits for the callers to finish, or counts those still in a call HangBound past
// their deadline as hung (each caller has at most one call out); then it fills in the
// longest call and the recovery time.
func (r *callRun) wait(running *sync.WaitGroup) {
	finished := make(chan struct{})
	go func() { running.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-untilPast(&r.endAt, r.deadline+HangBound, finished):
		r.mu.Lock()
		r.sum.Hung = r.inCall.Load()
		r.mu.Unlock()
	}
	r.mu.Lock()
	r.sum.MaxCallMs = ms(r.maxCall)
	r.mu.Unlock()
	if h, rec := r.healAt.Load(), r.recovered.Load(); h != 0 && rec != 0 {
		r.sum.RecoverMs = ms(time.Duration(rec - h))
	}
}

// closeClient closes the client once its windows are released (boundedly), stops the
// heal watch, and records what the client held: windows still exposed just before Close,
// what Close said (a pooled buffer never returned), and goroutines above base after.
func (r *callRun) closeClient(client *rpc.Client, base int, stopHeal chan<- struct{}) {
	// The client's own windows (large requests) are revoked by the responses, or
	// released when a connection fails: wait for that, boundedly.
	for wait := time.Now().Add(5 * time.Second); client.Stats().WindowsExposed > 0 && time.Now().Before(wait); {
		time.Sleep(10 * time.Millisecond)
	}
	r.sum.WindowsExposedAfter = client.Stats().WindowsExposed
	if err := client.Close(); err != nil {
		r.sum.CloseError = err.Error()
	}
	close(stopHeal)
	for wait := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > base && time.Now().Before(wait); {
		time.Sleep(10 * time.Millisecond)
	}
	r.sum.GoroutinesLeaked = max(0, runtime.NumGoroutine()-base)
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
