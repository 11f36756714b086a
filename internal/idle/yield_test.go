package idle

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestYieldRunsQueued: a goroutine readied by the yielder runs while it yields, with one P
// (so that nothing else could run it): a yield hands the P over rather than returning at
// once, and returns.
func TestYieldRunsQueued(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var ran atomic.Bool
	done := make(chan struct{})
	go func() { ran.Store(true); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for !ran.Load() {
		if time.Now().After(deadline) {
			t.Fatal("a goroutine readied before the yields did not run in 5 s of yields")
		}
		Yield()
	}
	<-done
}

// BenchmarkYield compares a yield of a P with others yielding on theirs at the same time
// (b.RunParallel, GOMAXPROCS goroutines): runtime.Gosched takes the scheduler's lock twice
// a yield, Yield none.
func BenchmarkYield(b *testing.B) {
	for _, bc := range []struct {
		name  string
		yield func()
	}{
		{"Gosched", runtime.Gosched},
		{"Yield", Yield},
	} {
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
// many-core server do, while the benchmark's goroutine hands a token around them; ns/op
// is a token's round through all of them.
func BenchmarkYieldSpinners(b *testing.B) {
	for _, bc := range []struct {
		name  string
		yield func()
	}{
		{"Gosched", runtime.Gosched},
		{"Yield", Yield},
	} {
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
