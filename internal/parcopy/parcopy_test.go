package parcopy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }

// withHelpers makes Copy use n helpers (0: what the machine says) until the test ends.
func withHelpers(t testing.TB, n int) { t.Cleanup(SetHelpers(n)) }

func random(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestCopy(t *testing.T) {
	cases := []struct {
		name       string
		dst, src   int
		helpers    int
		wantSplit  bool
		wantCopied int
	}{
		{"empty", 0, 0, 4, false, 0},
		{"small", 4096, 4096, 4, false, 4096},
		{"below split", minSplit - 1, minSplit - 1, 4, false, minSplit - 1},
		{"at split", minSplit, minSplit, 4, true, minSplit},
		{"1 MiB and a tail, one helper", 1<<20 + 13, 1<<20 + 13, 1, true, 1<<20 + 13},
		{"1 MiB and a tail, four helpers", 1<<20 + 13, 1<<20 + 13, 4, true, 1<<20 + 13},
		{"shorter dst", 1 << 20, 2 << 20, 3, true, 1 << 20},
		{"shorter src", 3 << 20, 1<<20 + 4097, 3, true, 1<<20 + 4097},
		{"16 MiB", 16 << 20, 16 << 20, 4, true, 16 << 20},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			withHelpers(t, c.helpers)
			src := random(c.src, uint64(c.src))
			dst := bytes.Repeat([]byte{0xa5}, c.dst)
			before := splits.Load()
			if n := Copy(dst, src); n != c.wantCopied {
				t.Fatalf("Copy returned %d, want %d", n, c.wantCopied)
			}
			if !bytes.Equal(dst[:c.wantCopied], src[:c.wantCopied]) {
				t.Fatalf("dst differs from src in the first %d bytes", c.wantCopied)
			}
			for i := c.wantCopied; i < len(dst); i++ {
				if dst[i] != 0xa5 {
					t.Fatalf("dst[%d] written past the copy", i)
				}
			}
			if split := splits.Load() != before; split != c.wantSplit {
				t.Errorf("split %v, want %v", split, c.wantSplit)
			}
		})
	}
}

// TestLargeThreshold: CopyLarge and Clone split only from largeSplit bytes, and
// copy every byte either way.
func TestLargeThreshold(t *testing.T) {
	withHelpers(t, 3)
	for _, n := range []int{minSplit, largeSplit - 1, largeSplit, largeSplit + 4097} {
		src := random(n, uint64(n))
		for _, f := range []struct {
			name string
			copy func() []byte
		}{
			{"CopyLarge", func() []byte { d := make([]byte, n); CopyLarge(d, src); return d }},
			{"Clone", func() []byte { return Clone(src) }},
		} {
			before := splits.Load()
			if got := f.copy(); !bytes.Equal(got, src) {
				t.Fatalf("%s of %d bytes: not the bytes of src", f.name, n)
			}
			if split, want := splits.Load() != before, n >= largeSplit; split != want {
				t.Errorf("%s of %d bytes: split %v, want %v", f.name, n, split, want)
			}
		}
	}
	if Clone(nil) != nil || Clone([]byte{}) != nil {
		t.Error("Clone of an empty slice is not nil, as append([]byte(nil)) gives")
	}
}

// TestCopyOverlap: buffers that share bytes are copied as the built-in copy copies them
// (a memmove), never in pieces that would read what another piece wrote.
func TestCopyOverlap(t *testing.T) {
	withHelpers(t, 4)
	for _, shift := range []int{-4096, -1, 1, 4096, 300 << 10} {
		t.Run(fmt.Sprint(shift), func(t *testing.T) {
			buf := random(4<<20, 7)
			want := bytes.Clone(buf)
			n := 2 << 20
			src, dst := 1<<20, 1<<20+shift
			copy(want[dst:dst+n], want[src:src+n])
			if got := Copy(buf[dst:dst+n], buf[src:src+n]); got != n {
				t.Fatalf("Copy returned %d, want %d", got, n)
			}
			if !bytes.Equal(buf, want) {
				t.Fatal("an overlapping copy differs from the built-in copy's")
			}
		})
	}
}

// TestCopyConcurrent: many goroutines copy at once, more than the helpers there are, so
// that hand-offs fail, helpers are shared and jobs are reused; every copy must be whole.
func TestCopyConcurrent(t *testing.T) {
	withHelpers(t, 3)
	const goroutines, rounds = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			size := minSplit + g*(97<<10)
			src, dst := random(size, uint64(g)), make([]byte, size)
			for r := range rounds {
				src[r] ^= byte(g + 1) // each round's bytes differ from the last's
				clear(dst)
				if Copy(dst, src); !bytes.Equal(dst, src) {
					errs <- fmt.Errorf("goroutine %d round %d: dst differs from src", g, r)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestHelpersEnd: the helpers a copy started end once they have had no work for
// idleExit, and never exceed maxHelpers.
func TestHelpersEnd(t *testing.T) {
	withHelpers(t, maxHelpers)
	src, dst := random(4<<20, 3), make([]byte, 4<<20)
	for range 10 {
		Copy(dst, src)
		if n := alive.Load(); n > maxHelpers {
			t.Fatalf("%d helpers run, at most %d may", n, maxHelpers)
		}
	}
	deadline := time.Now().Add(idleExit + 5*time.Second)
	for alive.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d helpers still run %v after the last copy", alive.Load(), idleExit+5*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIdleHelpers: with Ps idle, a copy may have helpers, as many as the machine allows at
// most; asking costs no allocation.
func TestIdleHelpers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	time.Sleep(3 * time.Millisecond) // past the last reading of GOMAXPROCS (idle)
	if h := idleHelpers(); h < 0 || h > helpersFor(8) {
		t.Fatalf("idleHelpers() = %d with 8 Ps, want 0 to %d", h, helpersFor(8))
	}
	if h := idleHelpers(); h == 0 {
		t.Errorf("idleHelpers() = 0 with 8 Ps and this test alone running")
	}
	if a := testing.AllocsPerRun(100, func() { idleHelpers() }); a != 0 {
		t.Errorf("idleHelpers allocates %.1f times", a)
	}
}

func TestHelpersFor(t *testing.T) {
	for _, c := range []struct{ procs, want int }{{1, 0}, {2, 0}, {3, 0}, {4, 1}, {6, 2}, {8, 3}, {10, 4}, {64, 4}} {
		if got := helpersFor(c.procs); got != c.want {
			t.Errorf("helpersFor(%d) = %d, want %d", c.procs, got, c.want)
		}
	}
}

// BenchmarkCopy compares the built-in copy with Copy at the helper counts a machine
// gives; on a machine of two cores the helpers only share them.
func BenchmarkCopy(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20} {
		src, dst := random(size, 1), make([]byte, size)
		b.Run(fmt.Sprintf("builtin/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				copy(dst, src)
			}
		})
		for _, h := range []int{1, 3} {
			b.Run(fmt.Sprintf("helpers%d/%dKiB", h, size>>10), func(b *testing.B) {
				withHelpers(b, h)
				b.SetBytes(int64(size))
				for b.Loop() {
					Copy(dst, src)
				}
			})
		}
	}
}

// TestNoAllocs: once helpers run, a split copy allocates nothing, whichever side releases
// its job last.
func TestNoAllocs(t *testing.T) {
	withHelpers(t, 3)
	src, dst := random(1<<20, 1), make([]byte, 1<<20)
	Copy(dst, src) // starts the helpers
	if a := testing.AllocsPerRun(200, func() { Copy(dst, src) }); a != 0 {
		t.Errorf("a split copy allocates %.2f times", a)
	}
}

// cloneSink keeps BenchmarkClone's clones from being optimized away.
var cloneSink []byte

// BenchmarkClone compares Clone, which allocates what it copies into (a default client's
// copy of its response), with a copy into memory reused every time: the difference is
// the allocation and the garbage collections a fresh buffer per call paces (compare
// GOGC=400 in the environment).
func BenchmarkClone(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		src, dst := random(size, 1), make([]byte, size)
		b.Run(fmt.Sprintf("clone/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				cloneSink = Clone(src)
			}
		})
		b.Run(fmt.Sprintf("reused/%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}
