package rpc

import (
	"sync/atomic"
	"testing"
	"unsafe"
)

// TestLenderSpreads checks that loans of neighbouring memory (what a caller gets from
// Client.Buffer and a response lent from a receive slot: buffers of one pool class and
// slots side by side) are spread over the lender's shards rather than recorded under one
// lock: lending from many cores at once queued on a single lock and cost more CPU per call
// than copying (BenchmarkLentParallel with -cpu 8).
func TestLenderSpreads(t *testing.T) {
	mem := make([]byte, 256<<10)
	for _, stride := range []int{64, 256, 1 << 10, 4 << 10} {
		var l lender
		used := make(map[*lendShard]int)
		n := 0
		for off := 0; off+stride <= len(mem) && n < 4*lendShards; off += stride {
			key := &mem[off]
			used[l.shard(key)]++
			l.put(key, loan{})
			n++
		}
		// 4 loans per shard on average: a fair hash leaves few shards empty and none
		// holding more than a few times its share.
		most := 0
		for _, k := range used {
			most = max(most, k)
		}
		if len(used) < lendShards*3/4 || most > 16 {
			t.Errorf("%d loans %d bytes apart: %d of %d shards used, the busiest holding %d: loans must spread over the shards", n, stride, len(used), lendShards, most)
		}
		for sh, k := range used {
			if len(sh.out) != k {
				t.Errorf("%d bytes apart: a shard records %d loans, want %d", stride, len(sh.out), k)
			}
		}
		for off := 0; off < n*stride; off += stride {
			if _, ok := l.take(mem[off : off+1]); !ok {
				t.Fatalf("%d bytes apart: loan at offset %d not found", stride, off)
			}
		}
	}
}

// TestLenderTakeRequest checks takeRequest's lookups: only a request buffer's loan is
// taken, a response's stays lent, and a []byte that is not lent memory is left alone.
func TestLenderTakeRequest(t *testing.T) {
	var l lender
	mem := make([]byte, 4096)
	resp := mem[1024:2048]
	l.put(unsafe.SliceData(resp), loan{})
	l.shard(unsafe.SliceData(resp)).bufs.Add(1) // as if a request buffer were lent beside it
	if b := l.takeRequest(resp); b != nil {
		t.Fatal("takeRequest took a response's loan")
	}
	if _, ok := l.take(resp); !ok {
		t.Fatal("a response's loan was lost by takeRequest")
	}
	if b := l.takeRequest(mem[:64]); b != nil {
		t.Fatal("takeRequest took memory that was never lent")
	}
}

// BenchmarkLender prices one lent call's records (a request buffer lent and taken, a
// response lent and released) from many goroutines at once, each on memory of its own.
//
//	go test -run '^$' -bench Lender -cpu 1,2,8 ./rpc/
func BenchmarkLender(b *testing.B) {
	var l lender
	mem := make([]byte, 1<<20)
	var next atomic.Int64 // each goroutine's 2 KiB of mem: a request's 1 KiB and a response's
	b.RunParallel(func(pb *testing.PB) {
		off := int(next.Add(2<<10)-2<<10) % len(mem)
		req, resp := &mem[off], &mem[off+1<<10]
		for pb.Next() {
			l.put(req, loan{})
			l.take(unsafe.Slice(req, 1))
			l.put(resp, loan{})
			l.take(unsafe.Slice(resp, 1))
		}
	})
}
