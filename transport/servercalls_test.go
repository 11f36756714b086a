package transport

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestServedTable: whatever ids a peer picks, a served call is found by its id, and by no
// other, until it is removed; an mwrpc client's ids (a slot in the low half, its use in the
// high half) stay in slots, and ids that do not fit them (past maxServedSlots, or a slot
// another call holds) go to the map without growing slots past its bound.
func TestServedTable(t *testing.T) {
	slot := func(gen, i uint32) uint64 { return uint64(gen)<<32 | uint64(i) }
	tests := []struct {
		name     string
		ids      []uint64
		inSlots  int // of ids, the calls kept in slots
		maxSlots int // how long slots may grow
	}{
		{"none", nil, 0, 0},
		{"dense slots", []uint64{slot(1, 0), slot(1, 1), slot(1, 2), slot(3, 3)}, 4, 4},
		{"one slot, two uses", []uint64{slot(1, 5), slot(2, 5)}, 1, 6},
		{"id 0", []uint64{0}, 1, 1},
		{"past the bound", []uint64{slot(1, maxServedSlots), ^uint64(0), 1<<50 | (maxServedSlots + 7)}, 0, 0},
		{"last slot", []uint64{slot(9, maxServedSlots-1)}, 1, maxServedSlots},
		{"sparse", []uint64{slot(1, 900), slot(1, 2), slot(7, 900), slot(1, 5000)}, 2, 901},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var tb servedTable
			calls := make([]*serverCall, len(tc.ids))
			for i, id := range tc.ids {
				if tb.get(id) != nil {
					t.Fatalf("id %#x found before it was added", id)
				}
				calls[i] = &serverCall{id: id}
				tb.add(calls[i])
			}
			if len(tb.slots) > tc.maxSlots {
				t.Fatalf("slots grew to %d, want at most %d", len(tb.slots), tc.maxSlots)
			}
			if got := len(tc.ids) - len(tb.more); got != tc.inSlots {
				t.Fatalf("%d calls in slots, want %d", got, tc.inSlots)
			}
			for _, sc := range calls {
				if got := tb.get(sc.id); got != sc {
					t.Fatalf("get(%#x) = %p, want %p", sc.id, got, sc)
				}
				for _, other := range []uint64{sc.id + 1<<32, sc.id ^ 1} { // the same slot's other use; a neighbour
					if !slices.Contains(tc.ids, other) && tb.get(other) != nil {
						t.Fatalf("get(%#x), an id not added, found a call", other)
					}
				}
			}
			var seen []*serverCall
			tb.each(func(sc *serverCall) { seen = append(seen, sc) })
			if len(seen) != len(calls) || tb.len() != len(calls) {
				t.Fatalf("each saw %d calls and len is %d, want %d", len(seen), tb.len(), len(calls))
			}
			for i, sc := range calls {
				tb.remove(sc)
				if tb.get(sc.id) != nil {
					t.Fatalf("id %#x still found after its call was removed", sc.id)
				}
				for _, rest := range calls[i+1:] {
					if tb.get(rest.id) != rest {
						t.Fatalf("removing %#x lost %#x", sc.id, rest.id)
					}
				}
			}
			if tb.len() != 0 || len(tb.more) != 0 || slices.ContainsFunc(tb.slots, func(sc *serverCall) bool { return sc != nil }) {
				t.Fatalf("%d calls left (%d in the map) after every one was removed", tb.len(), len(tb.more))
			}
		})
	}
}

// TestServedTableChurn: an mwrpc client's pattern, slots reused with new uses, keeps every
// call in slots and never allocates the map.
func TestServedTableChurn(t *testing.T) {
	var tb servedTable
	live := make(map[uint32]*serverCall)
	for n := range uint32(10000) {
		i := n * 7 % 64
		if sc := live[i]; sc != nil {
			tb.remove(sc)
		}
		sc := &serverCall{id: uint64(n+1)<<32 | uint64(i)}
		if tb.get(sc.id) != nil {
			t.Fatalf("id %#x found before it was added", sc.id)
		}
		tb.add(sc)
		live[i] = sc
	}
	if tb.more != nil || len(tb.slots) != 64 || tb.len() != 64 {
		t.Fatalf("slots %d, map %v, len %d: want 64 slots, no map, 64 calls", len(tb.slots), tb.more != nil, tb.len())
	}
}

// TestServedTableTakesClientIDs: the ids this package's client gives its calls land in
// the server's slots, over every fabric: with 32 calls being served at once, no call is in
// the map (none is made), and the slots are no longer than the client's call table. A
// client that numbered its calls otherwise would still be served, through the map, and
// only this test would tell.
func TestServedTableTakesClientIDs(t *testing.T) {
	const n = 32
	for _, fb := range fabrics {
		t.Run(fb.name, func(t *testing.T) {
			in := make(chan struct{}, n)
			release := make(chan struct{})
			h := HandlerFunc(func(ctx context.Context, req []byte, w *ResponseWriter) {
				in <- struct{}{}
				<-release
				_ = w.Write(StatusOK, req)
			})
			e := newEnv(t, fb, h, Config{})
			sc := e.serverConn(t)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := e.conn.Call(context.Background(), []byte{byte(i)})
					if err != nil {
						errs <- err
						return
					}
					resp.Release()
				}()
			}
			defer func() {
				close(release)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
			}()
			timeout := time.After(10 * time.Second)
			for range n {
				select {
				case <-in:
				case <-timeout:
					t.Fatalf("%d of %d calls reached the handler in 10s", len(in), n)
				}
			}
			sc.mu.Lock()
			served, inMap, slots := sc.serving.calls.len(), len(sc.serving.calls.more), len(sc.serving.calls.slots)
			made := sc.serving.calls.more != nil
			sc.mu.Unlock()
			e.conn.mu.Lock()
			clientSlots := len(e.conn.calls.slots)
			e.conn.mu.Unlock()
			if served != n || inMap != 0 || made || slots > clientSlots {
				t.Fatalf("%d calls served (want %d), %d of them in the map (map made: %v), %d slots against the client's %d: the client's ids did not land in the server's slots",
					served, n, inMap, made, slots, clientSlots)
			}
		})
	}
}
