package pool

import (
	"context"
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentGetRelease hammers a small pool from several goroutines: growth races,
// stealing between shards, waiting at the cap, and buffers released by another goroutine
// than the one that took them. Every holder stamps its buffer and checks nobody else
// wrote it; at the end every buffer is back.
func TestConcurrentGetRelease(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"sharded", Config{Classes: []int{256, 4096}, SlabSize: 4096, MaxBytes: 6 * 4096}},
		{"one shard", Config{Classes: []int{256, 4096}, SlabSize: 4096, MaxBytes: 6 * 4096, Shards: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newTestPool(t, tt.cfg)
			const workers = 8
			iters := 3000
			if debug {
				iters = 500
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			handoff := make(chan *Buf, 4)
			var releasers sync.WaitGroup
			releasers.Add(1)
			go func() { // releases buffers it did not take
				defer releasers.Done()
				for b := range handoff {
					b.Release()
				}
			}()
			var wg sync.WaitGroup
			var stamps atomic.Uint64
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range iters {
						n := 16 + (i*7+w)%4000
						var b *Buf
						var err error
						if i%3 == 0 {
							b, err = p.TryGet(n)
							if err != nil {
								continue // exhausted: fine
							}
						} else if b, err = p.Get(ctx, n); err != nil {
							t.Errorf("worker %d: Get(%d): %v", w, n, err)
							return
						}
						stamp := stamps.Add(1)
						bs := b.Bytes()
						binary.LittleEndian.PutUint64(bs, stamp)
						binary.LittleEndian.PutUint64(bs[len(bs)-8:], stamp)
						if i%5 == 0 {
							runtime.Gosched()
						}
						if binary.LittleEndian.Uint64(bs) != stamp || binary.LittleEndian.Uint64(bs[len(bs)-8:]) != stamp {
							t.Errorf("worker %d: buffer 0x%x written by another holder", w, b.Addr())
							return
						}
						if i%4 == 0 {
							handoff <- b
						} else {
							b.Release()
						}
					}
				}()
			}
			wg.Wait()
			close(handoff)
			releasers.Wait()
			st := p.Stats()
			t.Logf("classes: %+v", st.Classes)
			for _, c := range st.Classes {
				if c.InUse != 0 {
					t.Errorf("class %d: %+v", c.Size, c)
				}
			}
			if st.RegisteredBytes > tt.cfg.MaxBytes {
				t.Errorf("registered %d bytes, cap %d", st.RegisteredBytes, tt.cfg.MaxBytes)
			}
			if err := p.CheckLeaks(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestConcurrentDoubleRelease releases one buffer from two goroutines at once: exactly one
// of them must panic.
func TestConcurrentDoubleRelease(t *testing.T) {
	p, _ := newTestPool(t, Config{Classes: []int{256}})
	for range 200 {
		b := mustGet(t, p, 1)
		var panics atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if r := recover(); r != nil {
						if _, ok := r.(*MisuseError); !ok {
							t.Errorf("panic %v", r)
						}
						panics.Add(1)
					}
				}()
				<-start
				b.Release()
			}()
		}
		close(start)
		wg.Wait()
		if panics.Load() != 1 {
			t.Fatalf("%d of 2 concurrent Releases panicked, want 1", panics.Load())
		}
	}
}
