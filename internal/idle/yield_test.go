package idle

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestYieldRunsQueued: a goroutine readied before a Yield (goyield) runs during it, with
// one P (so that nothing else could run it): the link to the runtime hands the P over
// rather than returning at once, and returns.
func TestYieldRunsQueued(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var ran atomic.Bool
	go func() { ran.Store(true) }()
	deadline := time.Now().Add(5 * time.Second)
	for !ran.Load() {
		if time.Now().After(deadline) {
			t.Fatal("a goroutine readied before the yields did not run in 5 s of goyields")
		}
		Yield()
	}
}

// TestYielderTurnsKind: a yielder uses goyield while its rounds come back within
// aloneRound and Gosched for good once one takes longer.
func TestYielderTurnsKind(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rounds []time.Duration // each round's length
		busy   bool
	}{
		{"short rounds", []time.Duration{300, 400, 500, 300}, false},
		{"a long round", []time.Duration{300, 5000}, true},
		{"short again after a long one", []time.Duration{300, 5000, 300, 300}, true},
		{"a long first round", []time.Duration{2000}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var y yielder
			var since time.Duration
			for _, r := range tc.rounds {
				since += r
				y.yield(since)
			}
			if y.busyP != tc.busy {
				t.Fatalf("busyP = %v after rounds %v, want %v", y.busyP, tc.rounds, tc.busy)
			}
		})
	}
}

// yields are the two ways of yielding the benchmarks compare.
var yields = []struct {
	name  string
	yield func()
}{
	{"Gosched", runtime.Gosched},
	{"goyield", goyield},
}

// BenchmarkYield compares a yield of a P with others yielding on theirs at the same time
// (b.RunParallel, GOMAXPROCS goroutines): runtime.Gosched takes the scheduler's lock twice
// a yield, goyield none.
func BenchmarkYield(b *testing.B) {
	for _, bc := range yields {
		b.Run(bc.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.yield()
				}
			})
		})
	}
}

// BenchmarkYieldSpinners: 8 goroutines per P yield in a loop, as pollers on a loaded
// many-core server do, passing a token around; ns/op is the token's round through all.
func BenchmarkYieldSpinners(b *testing.B) {
	for _, bc := range yields {
		b.Run(bc.name, func(b *testing.B) {
			n := 8 * runtime.GOMAXPROCS(0)
			var turn atomic.Int64
			var stop atomic.Bool
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						if t := turn.Load(); t%int64(n) == int64(i) && t < int64(b.N)*int64(n) {
							turn.Add(1)
						}
						bc.yield()
					}
				}()
			}
			for turn.Load() < int64(b.N)*int64(n) {
				time.Sleep(100 * time.Microsecond)
			}
			stop.Store(true)
			wg.Wait()
		})
	}
}
