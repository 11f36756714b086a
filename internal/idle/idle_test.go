package idle

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// settle waits past procsRefresh (and refresh) so that the next question reads the
// figures anew.
func settle() { time.Sleep(2 * procsRefresh) }

func TestQuietNeedsCores(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	settle()
	if Quiet() {
		t.Fatal("Quiet() with GOMAXPROCS 2: want false (too few cores to spin on)")
	}
}

func TestQuietAndBusy(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	settle()
	if !Quiet() {
		t.Fatalf("Quiet() = false with GOMAXPROCS 8 and only this test running (busy %d)", busy.Load())
	}
	if p := Procs(); p < 8-2 {
		t.Fatalf("Procs() = %d with GOMAXPROCS 8 and only this test running, want at least 6", p)
	}

	// Eight goroutines that never block keep every P running.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for Quiet() || Procs() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("with 8 goroutines spinning on 8 Ps: Quiet() = %v, Procs() = %d; want false and 0", Quiet(), Procs())
		}
		settle()
	}
}

func TestNoAllocs(t *testing.T) {
	settle()
	if a := testing.AllocsPerRun(100, func() { settle(); Quiet(); Procs() }); a != 0 {
		t.Fatalf("a reading allocates %.1f times", a)
	}
}

func BenchmarkQuiet(b *testing.B) {
	for b.Loop() {
		Quiet()
	}
}

func TestForceQuiet(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	settle()
	restore := ForceQuiet(true)
	if !Quiet() {
		t.Error("Quiet() = false with ForceQuiet(true)")
	}
	restore()
	if Quiet() {
		t.Error("Quiet() = true with GOMAXPROCS 2 after ForceQuiet's restore")
	}
	defer ForceQuiet(false)()
	runtime.GOMAXPROCS(8)
	settle()
	if Quiet() {
		t.Error("Quiet() = true with ForceQuiet(false)")
	}
}

func TestQuietBusy(t *testing.T) {
	for _, c := range []struct{ procs, want int64 }{{4, 2}, {6, 2}, {8, 3}, {16, 7}, {64, 31}} {
		if got := quietBusy(c.procs); got != c.want {
			t.Errorf("quietBusy(%d) = %d, want %d", c.procs, got, c.want)
		}
	}
}
