package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// newTestPool returns a pool on a fake PD whose teardown fails the test on leaked buffers
// and on memory regions left registered.
func newTestPool(t testing.TB, cfg Config) (*Pool, *fakePD) {
	t.Helper()
	pd := newFakePD()
	p, err := New(pd, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if mrs, _ := pd.live(); mrs != 0 {
			t.Errorf("%d memory regions still registered after Close", mrs)
		}
	})
	return p, pd
}

func mustGet(t testing.TB, p *Pool, n int) *Buf {
	t.Helper()
	b, err := p.TryGet(n)
	if err != nil {
		t.Fatalf("TryGet(%d): %v", n, err)
	}
	return b
}

func TestGetBuffer(t *testing.T) {
	p, _ := newTestPool(t, Config{})
	tests := []struct {
		n, wantCap int
	}{
		{0, 256}, {1, 256}, {256, 256}, {257, 512}, {4096, 4096}, {4097, 8192},
		{1 << 20, 1 << 20}, {16 << 20, 16 << 20},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.n), func(t *testing.T) {
			b, err := p.Get(context.Background(), tt.n)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Release()
			bs := b.Bytes()
			if len(bs) != tt.n || cap(bs) != tt.wantCap || b.Len() != tt.n || b.Cap() != tt.wantCap {
				t.Fatalf("len %d cap %d (Len %d Cap %d), want %d and %d", len(bs), cap(bs), b.Len(), b.Cap(), tt.n, tt.wantCap)
			}
			mr := b.MR()
			if b.LKey() != mr.LKey() || b.RKey() != mr.RKey() {
				t.Errorf("keys %x/%x, region's %x/%x", b.LKey(), b.RKey(), mr.LKey(), mr.RKey())
			}
			if b.Addr() < mr.Addr() || b.Addr()+uint64(b.Cap()) > mr.Addr()+uint64(len(mr.Bytes())) {
				t.Errorf("buffer 0x%x+%d outside its region 0x%x+%d", b.Addr(), b.Cap(), mr.Addr(), len(mr.Bytes()))
			}
			if (b.Addr()-mr.Addr())%uint64(tt.wantCap) != 0 {
				t.Errorf("buffer at offset %d of its slab, not a multiple of %d", b.Addr()-mr.Addr(), tt.wantCap)
			}
			if tt.n > 0 && verbs.AddrOf(bs) != b.Addr() {
				t.Errorf("Bytes at 0x%x, Addr 0x%x", verbs.AddrOf(bs), b.Addr())
			}
			if mr.Access() != verbs.AccessLocalWrite|verbs.AccessMWBind {
				t.Errorf("region access %v", mr.Access())
			}
			want := verbs.SGE{Addr: b.Addr(), Length: uint32(tt.n), LKey: mr.LKey()}
			if sge := b.SGE(); sge != want {
				t.Errorf("SGE %+v, want %+v", sge, want)
			}
			fill(bs[:cap(bs)], 0x5a) // the whole class is writable
			b.SetLen(tt.wantCap)
			if b.Len() != tt.wantCap || b.SGE().Length != uint32(tt.wantCap) {
				t.Errorf("after SetLen(%d): Len %d", tt.wantCap, b.Len())
			}
		})
	}
}

// TestSlice checks that a sliced buffer exposes exactly its range, that a range outside
// the class panics with a *MisuseError, and that the next Get of the slot starts whole.
func TestSlice(t *testing.T) {
	p, _ := newTestPool(t, Config{Classes: []int{4096}, Shards: 1})
	tests := []struct{ off, n int }{{0, 4096}, {512, 100}, {4096, 0}, {4000, 96}, {17, 0}}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d+%d", tt.off, tt.n), func(t *testing.T) {
			b := mustGet(t, p, 10)
			defer b.Release()
			base, mem := b.Addr(), b.Bytes()[:4096]
			fill(mem, 0)
			mem[tt.off%4096] = 7
			b.Slice(tt.off, tt.n)
			if b.Len() != tt.n || b.Cap() != 4096-tt.off || b.Addr() != base+uint64(tt.off) {
				t.Fatalf("Len %d Cap %d Addr +%d, want %d, %d, +%d", b.Len(), b.Cap(), b.Addr()-base, tt.n, 4096-tt.off, tt.off)
			}
			if bs := b.Bytes(); len(bs) != tt.n || cap(bs) != 4096-tt.off || tt.n > 0 && (bs[0] != 7 || verbs.AddrOf(bs) != b.Addr()) {
				t.Fatalf("Bytes: len %d cap %d", len(bs), cap(bs))
			}
			if sge := b.SGE(); sge.Addr != b.Addr() || sge.Length != uint32(tt.n) {
				t.Fatalf("SGE %+v", sge)
			}
			b.SetLen(b.Cap())
			if b.Len() != 4096-tt.off {
				t.Fatalf("SetLen(Cap): Len %d", b.Len())
			}
			if me := catch(t, func() { b.SetLen(b.Cap() + 1) }); me == nil {
				t.Fatal("SetLen past Cap after Slice did not panic")
			}
		})
	}
	b := mustGet(t, p, 10)
	for _, bad := range [][2]int{{-1, 1}, {0, 4097}, {4097, 0}, {4000, 97}, {1, -1}} {
		if me := catch(t, func() { b.Slice(bad[0], bad[1]) }); me == nil || !strings.Contains(me.Error(), "outside 0..4096") {
			t.Errorf("Slice(%d, %d): panic %v, want a range error", bad[0], bad[1], me)
		}
	}
	b.Slice(100, 5)
	b.Release()
	if b = mustGet(t, p, 10); b.Len() != 10 || b.Cap() != 4096 { // the slot's next Get starts whole
		t.Errorf("after a sliced buffer's release, Get gives Len %d Cap %d", b.Len(), b.Cap())
	}
	b.Release()
}

func TestClassFor(t *testing.T) {
	pow2, _ := newTestPool(t, Config{Classes: []int{64, 128, 256, 512}})
	odd, _ := newTestPool(t, Config{Classes: []int{100, 1000, 3000, 5000}, SlabSize: 64 << 10})
	tests := []struct {
		p       *Pool
		n, want int
		err     error
	}{
		{pow2, 0, 64, nil}, {pow2, 64, 64, nil}, {pow2, 65, 128, nil}, {pow2, 129, 256, nil},
		{pow2, 512, 512, nil}, {pow2, 513, 0, ErrTooLarge}, {pow2, -1, 0, verbs.ErrInvalid},
		{odd, 1, 100, nil}, {odd, 100, 100, nil}, {odd, 101, 1000, nil}, {odd, 1000, 1000, nil},
		{odd, 2999, 3000, nil}, {odd, 3001, 5000, nil}, {odd, 5000, 5000, nil}, {odd, 5001, 0, ErrTooLarge},
	}
	for _, tt := range tests {
		c, err := tt.p.classFor(tt.n)
		switch {
		case tt.err != nil && !errors.Is(err, tt.err):
			t.Errorf("%v classFor(%d): err %v, want %v", tt.p.Classes(), tt.n, err, tt.err)
		case tt.err == nil && (err != nil || c.size != tt.want):
			t.Errorf("%v classFor(%d): %v %v, want class %d", tt.p.Classes(), tt.n, c, err, tt.want)
		}
	}
	if _, err := pow2.Get(context.Background(), 1<<20); err == nil || !strings.Contains(err.Error(), "512 B") {
		t.Errorf("Get past the largest class: %v, want an error naming 512 B", err)
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unsorted", Config{Classes: []int{512, 256}}, "ascending"},
		{"zero class", Config{Classes: []int{0, 256}}, "outside"},
		{"cap below one slab", Config{Classes: []int{1 << 20}, MaxBytes: 1 << 19}, "cap is 512 KiB"},
		{"negative", Config{MaxBytes: -1}, "negative"},
		{"policy", Config{Memlock: 9}, "memlock policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(newFakePD(), tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, verbs.ErrInvalid) {
				t.Fatalf("New: %v, want an ErrInvalid mentioning %q", err, tt.want)
			}
		})
	}
}

func TestSlabGeometry(t *testing.T) {
	tests := []struct {
		cfg             Config
		size            int
		count, mapBytes int
	}{
		{Config{SlabSize: 1 << 20}, 4096, 256, 1 << 20},
		{Config{SlabSize: 1 << 20}, 16 << 20, 1, 16 << 20},
		{Config{SlabSize: 1 << 20}, 3000, 256, (3000*256 + 4095) / 4096 * 4096},
		{Config{SlabSize: 1 << 20, HugePages: true}, 4096, 512, 2 << 20},
		{Config{SlabSize: 100}, 256, 16, 4096},
	}
	for _, tt := range tests {
		count, mapBytes := tt.cfg.slabGeometry(tt.size)
		if count != tt.count || mapBytes != tt.mapBytes {
			t.Errorf("%+v size %d: %d buffers in %d bytes, want %d in %d", tt.cfg, tt.size, count, mapBytes, tt.count, tt.mapBytes)
		}
	}
}

// catch runs f and returns its panic value as a *MisuseError, or nil.
func catch(t *testing.T, f func()) (me *MisuseError) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			var ok bool
			if me, ok = r.(*MisuseError); !ok {
				t.Fatalf("panic %v (%T), want a *MisuseError", r, r)
			}
		}
	}()
	f()
	return nil
}

func TestMisuse(t *testing.T) {
	ops := []struct {
		name string
		f    func(*Buf)
	}{
		{"Release", (*Buf).Release},
		{"Bytes", func(b *Buf) { b.Bytes() }},
		{"Len", func(b *Buf) { b.Len() }},
		{"SetLen", func(b *Buf) { b.SetLen(1) }},
		{"LKey", func(b *Buf) { b.LKey() }},
		{"RKey", func(b *Buf) { b.RKey() }},
		{"Addr", func(b *Buf) { b.Addr() }},
		{"MR", func(b *Buf) { b.MR() }},
		{"SGE", func(b *Buf) { b.SGE() }},
		{"Slice", func(b *Buf) { b.Slice(0, 1) }},
	}
	p, _ := newTestPool(t, Config{Classes: []int{4096}, Shards: 1})
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			b := mustGet(t, p, 100)
			addr := b.Addr()
			b.Release()
			me := catch(t, func() { op.f(b) })
			if me == nil {
				t.Fatalf("%s after Release did not panic", op.name)
			}
			want := "use after Release"
			if op.name == "Release" {
				want = "double Release"
			}
			msg := me.Error()
			for _, w := range []string{want, op.name, "4 KiB buffer", fmt.Sprintf("0x%x", addr), "slot"} {
				if !strings.Contains(msg, w) {
					t.Errorf("panic %q does not mention %q", msg, w)
				}
			}
		})
	}
	t.Run("nil", func(t *testing.T) {
		var b *Buf
		if me := catch(t, func() { b.Bytes() }); me == nil || !strings.Contains(me.Error(), "nil buffer") {
			t.Errorf("Bytes on nil: %v", me)
		}
	})
	t.Run("SetLen past cap", func(t *testing.T) {
		b := mustGet(t, p, 1)
		defer b.Release()
		if me := catch(t, func() { b.SetLen(4097) }); me == nil || !strings.Contains(me.Error(), "outside 0..4096") {
			t.Errorf("SetLen(4097): %v", me)
		}
	})
	t.Run("stale handle", func(t *testing.T) {
		if !debug {
			t.Skip("a release build reuses the handle: only a debug build (-race, -tags mwrpcdebug) sees a stale one")
		}
		b := mustGet(t, p, 1)
		b.Release()
		b2 := mustGet(t, p, 1) // one shard, LIFO: the same slot
		defer b2.Release()
		if b2.Addr() != verbs.AddrOf(b2.Bytes()) || b2.s != b.s {
			t.Fatal("expected the same slot back")
		}
		for _, op := range []string{"Release", "Bytes"} {
			f := (*Buf).Release
			if op == "Bytes" {
				f = func(b *Buf) { b.Bytes() }
			}
			if me := catch(t, func() { f(b) }); me == nil || !strings.Contains(me.Error(), "stale handle") {
				t.Errorf("%s on a stale handle: %v", op, me)
			}
		}
	})
	t.Run("write after release", func(t *testing.T) {
		if !debug {
			t.Skip("poisoning is on in a debug build only")
		}
		b := mustGet(t, p, 64)
		bs := b.Bytes()
		b.Release()
		bs[10] = 1 // the bug
		me := catch(t, func() { mustGet(t, p, 64).Release() })
		if me == nil || !strings.Contains(me.Error(), "write after Release: byte 10") {
			t.Errorf("Get after a write to a free buffer: %v", me)
		}
		b3 := mustGet(t, p, 64) // the pool repaired the slot and kept it
		if b3.s != b.s {
			t.Error("the damaged slot was not put back")
		}
		b3.Release()
	})
}

func TestLeakDetection(t *testing.T) {
	pd := newFakePD()
	p, err := New(pd, Config{Classes: []int{256, 4096}, TrackLeaks: true})
	if err != nil {
		t.Fatal(err)
	}
	kept := leakOne(t, p)
	released := mustGet(t, p, 10)
	released.Release()

	err = p.CheckLeaks()
	var le *LeakError
	if !errors.Is(err, ErrLeaked) || !errors.As(err, &le) || len(le.Leaks) != 1 {
		t.Fatalf("CheckLeaks: %v, want one leak", err)
	}
	l := le.Leaks[0]
	if l.Size != 4096 || l.Len != 3000 || l.Addr != kept.Addr() || time.Since(l.Since) > time.Minute {
		t.Errorf("leak %+v", l)
	}
	msg := err.Error()
	for _, w := range []string{"1 buffer(s) never released", "4 KiB buffer", "len 3000", "pool.leakOne", "pool_test.go"} {
		if !strings.Contains(msg, w) {
			t.Errorf("leak report does not mention %q:\n%s", w, msg)
		}
	}
	if strings.Contains(msg, "(*Pool).TryGet") || strings.Contains(msg, "(*class).take") {
		t.Errorf("leak report starts inside the pool:\n%s", msg)
	}

	// Close reports the leak, deregisters every slab and keeps the leaked one mapped.
	err = p.Close()
	if !errors.Is(err, ErrLeaked) || !strings.Contains(err.Error(), "pool.leakOne") {
		t.Errorf("Close: %v, want the leak", err)
	}
	if mrs, _ := pd.live(); mrs != 0 {
		t.Errorf("%d regions registered after Close", mrs)
	}
	kept.Bytes()[0] = 1 // still mapped: no fault
	kept.Release()
	if _, err := p.TryGet(1); !errors.Is(err, ErrClosed) {
		t.Errorf("TryGet after Close: %v", err)
	}
	if err := p.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

//go:noinline
func leakOne(t *testing.T, p *Pool) *Buf { return mustGet(t, p, 3000) }

func TestLeakWithoutTracking(t *testing.T) {
	if debug {
		t.Skip("a debug build always tracks")
	}
	p, err := New(newFakePD(), Config{Classes: []int{256}})
	if err != nil {
		t.Fatal(err)
	}
	b := mustGet(t, p, 1)
	err = p.CheckLeaks()
	if !errors.Is(err, ErrLeaked) || !strings.Contains(err.Error(), "set Config.TrackLeaks") {
		t.Errorf("CheckLeaks: %v", err)
	}
	b.Release()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func TestExhaustion(t *testing.T) {
	// Two slabs of four 4 KiB buffers, one slab of one 16 KiB buffer (class cap).
	cfg := Config{Classes: []int{4096, 16384}, SlabSize: 16384, MaxBytes: 3 * 16384, MaxClassBytes: 2 * 16384}
	p, pd := newTestPool(t, cfg)
	var bufs []*Buf
	for range 8 {
		bufs = append(bufs, mustGet(t, p, 4096))
	}
	_, err := p.TryGet(4096)
	var ee *ExhaustedError
	if !errors.Is(err, ErrPoolExhausted) || !errors.As(err, &ee) {
		t.Fatalf("TryGet at the class cap: %v, want ErrPoolExhausted", err)
	}
	for _, w := range []string{"class 4 KiB", "class cap 32 KiB", "pool cap 48 KiB"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not mention %q", err, w)
		}
	}
	if mrs, _ := pd.live(); mrs != 2 {
		t.Errorf("%d regions registered, want 2 slabs: never one per message", mrs)
	}

	// The pool cap: the 16 KiB class gets its one slab, then is exhausted too.
	big := mustGet(t, p, 16384)
	if _, err := p.TryGet(10000); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("TryGet past the pool cap: %v", err)
	}

	// Get waits on its context: it times out...
	start := time.Now() // before the context: its deadline counts from WithTimeout
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = p.Get(ctx, 100)
	if !errors.Is(err, ErrPoolExhausted) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) < 15*time.Millisecond {
		t.Errorf("Get at the cap with a 20ms deadline: %v after %v", err, time.Since(start))
	}
	// ...or is woken by a Release.
	got := make(chan *Buf)
	go func() {
		b, err := p.Get(context.Background(), 4096)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	for p.classes[0].waiters.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	want := bufs[3].Addr()
	bufs[3].Release()
	select {
	case b := <-got:
		if b.Addr() != want {
			t.Errorf("waiter got 0x%x, want the released 0x%x", b.Addr(), want)
		}
		bufs[3] = b
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by Release")
	}
	st := p.Stats()
	if c := st.Classes[0]; c.Waits != 2 || c.Exhausted != 2 || c.InUse != 8 || c.BytesInUse != 8*4096 || c.Slabs != 2 {
		t.Errorf("stats %+v", c)
	}
	big.Release()
	for _, b := range bufs {
		b.Release()
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	p, err := New(newFakePD(), Config{Classes: []int{4096}, SlabSize: 4096, MaxBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	b := mustGet(t, p, 1)
	errc := make(chan error)
	go func() {
		_, err := p.Get(context.Background(), 1)
		errc <- err
	}()
	for p.classes[0].waiters.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := p.Close(); !errors.Is(err, ErrLeaked) {
		t.Errorf("Close with a buffer out: %v", err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("waiting Get after Close: %v", err)
	}
	b.Release()
}

func TestGrowthAndStats(t *testing.T) {
	p, pd := newTestPool(t, Config{Classes: []int{1024, 2048}, SlabSize: 4096, Prealloc: 1})
	if mrs, _ := pd.live(); mrs != 2 {
		t.Fatalf("Prealloc 1: %d regions, want 2", mrs)
	}
	var bufs []*Buf
	for i := range 10 {
		bufs = append(bufs, mustGet(t, p, 1000+i))
	}
	st := p.Stats()
	c := st.Classes[0]
	if c.Size != 1024 || c.Slabs != 3 || c.Buffers != 12 || c.InUse != 10 || c.BytesInUse != 10*1024 {
		t.Errorf("class stats %+v", c)
	}
	if st.RegisteredBytes != 4*4096 || st.ProcessRegisteredBytes < st.RegisteredBytes {
		t.Errorf("registered %d (process %d), want %d", st.RegisteredBytes, st.ProcessRegisteredBytes, 4*4096)
	}
	seen := map[uint64]bool{}
	for _, b := range bufs {
		if seen[b.Addr()] {
			t.Fatalf("address 0x%x handed out twice", b.Addr())
		}
		seen[b.Addr()] = true
	}
	for _, b := range bufs {
		b.Release()
	}
	// Reuse never registers again.
	for range 100 {
		mustGet(t, p, 1024).Release()
	}
	if mrs, _ := pd.live(); mrs != 4 {
		t.Errorf("%d regions after reuse, want 4", mrs)
	}
	if c := p.Stats().Classes[0]; c.InUse != 0 || c.BytesInUse != 0 {
		t.Errorf("after release: %+v", c)
	}
}

func TestRegistrationError(t *testing.T) {
	pd := newFakePD()
	p, err := New(pd, Config{Classes: []int{4096}, Memlock: MemlockIgnore})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tests := []struct {
		cause error
		want  []string
	}{
		{fmt.Errorf("ibv_reg_mr: %w", verbs.ErrNoMemory), []string{"RLIMIT_MEMLOCK is", "ulimit -l", "LimitMEMLOCK"}},
		{fmt.Errorf("ibv_reg_mr: %w", verbs.ErrInvalid), []string{"register 1 MiB slab for class 4 KiB"}},
	}
	for _, tt := range tests {
		pd.mu.Lock()
		pd.failRegs = tt.cause
		pd.mu.Unlock()
		_, err := p.TryGet(1)
		if !errors.Is(err, tt.cause) {
			t.Errorf("TryGet: %v, want it to wrap %v", err, tt.cause)
		}
		if errors.Is(tt.cause, verbs.ErrNoMemory) != errors.Is(err, ErrMemlock) {
			t.Errorf("TryGet: %v: ErrMemlock %v", err, errors.Is(err, ErrMemlock))
		}
		for _, w := range tt.want {
			if !strings.Contains(fmt.Sprint(err), w) {
				t.Errorf("%v does not mention %q", err, w)
			}
		}
	}
	if st := p.Stats(); st.RegisteredBytes != 0 || st.Classes[0].Slabs != 0 {
		t.Errorf("failed registrations left %+v", st)
	}
}

func TestHugePagesFallback(t *testing.T) {
	var log bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, nil))
	p, _ := newTestPool(t, Config{Classes: []int{4096}, HugePages: true, Logger: logger})
	b := mustGet(t, p, 1)
	b2 := mustGet(t, p, 1)
	b.Release()
	b2.Release()
	mu.Lock()
	defer mu.Unlock()
	st := p.Stats().Classes[0]
	if st.Slabs != 1 || st.Buffers != 512 {
		t.Errorf("stats %+v, want one 2 MiB slab", st)
	}
	if st.HugeSlabs == 0 {
		if n := strings.Count(log.String(), "huge pages unavailable"); n != 1 {
			t.Errorf("fell back to normal pages with %d warnings, want 1:\n%s", n, log.String())
		}
	} else if log.Len() != 0 {
		t.Errorf("huge pages used, yet logged:\n%s", log.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func TestSizeString(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536: "1.5 KiB", 16 << 20: "16 MiB", 3 << 30: "3 GiB"} {
		if got := sizeString(n); got != want {
			t.Errorf("sizeString(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestSlotSize(t *testing.T) {
	if size := unsafe.Sizeof(slot{}); size != slotSize {
		t.Errorf("slot is %d bytes, want 128 (a pair of cache lines)", size)
	}
	p, _ := newTestPool(t, Config{Classes: []int{256, 1 << 20}, Prealloc: 1})
	for _, c := range p.classes {
		if addr := uintptr(unsafe.Pointer(&c.slabs[0].Load().slots[0])); addr%128 != 0 {
			t.Errorf("class %d: slots at 0x%x, not 128-byte aligned", c.size, addr)
		}
	}
}
