package pool

import (
	"fmt"
	"sync"
	"testing"
)

// The benchmarks compare a Get+Release cycle of the pool with the same cycle on a
// sync.Pool of []byte (stored as *[]byte, so that Put does not allocate), in one run.

var benchSizes = []int{4 << 10, 64 << 10}

func newBenchPool(b *testing.B) *Pool {
	p, err := New(newFakePD(), Config{Classes: benchSizes, Prealloc: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := p.Close(); err != nil {
			b.Error(err)
		}
	})
	return p
}

func newSyncPool(size int) *sync.Pool {
	return &sync.Pool{New: func() any {
		s := make([]byte, size)
		return &s
	}}
}

func BenchmarkGetPut(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("pool/%dKiB", size>>10), func(b *testing.B) {
			p := newBenchPool(b)
			b.ReportAllocs()
			for b.Loop() {
				buf, err := p.TryGet(size)
				if err != nil {
					b.Fatal(err)
				}
				buf.Bytes()[0] = 1
				buf.Release()
			}
		})
		b.Run(fmt.Sprintf("syncpool/%dKiB", size>>10), func(b *testing.B) {
			sp := newSyncPool(size)
			b.ReportAllocs()
			for b.Loop() {
				s := sp.Get().(*[]byte)
				(*s)[0] = 1
				sp.Put(s)
			}
		})
	}
}

func BenchmarkGetPutParallel(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("pool/%dKiB", size>>10), func(b *testing.B) {
			p := newBenchPool(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					buf, err := p.TryGet(size)
					if err != nil {
						b.Error(err)
						return
					}
					buf.Bytes()[0] = 1
					buf.Release()
				}
			})
		})
		b.Run(fmt.Sprintf("syncpool/%dKiB", size>>10), func(b *testing.B) {
			sp := newSyncPool(size)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					s := sp.Get().(*[]byte)
					(*s)[0] = 1
					sp.Put(s)
				}
			})
		})
	}
}
