package transport

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// tableConn is a connection as the tables see it: an id and a QP number.
func tableConn(id uint32) *Conn { return &Conn{id: id, qpn: id*7 + 3} }

// TestConnTable checks both tables against a map through churn that makes them rebuild
// and reuse tombstones, for dense keys and for keys that collide in the hash.
func TestConnTable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		byQPN bool
		ids   func(i int) uint32
		live  int
	}{
		{"ids dense", false, func(i int) uint32 { return uint32(i + 1) }, 100},
		{"qpns dense", true, func(i int) uint32 { return uint32(i + 1) }, 100},
		{"ids strided", false, func(i int) uint32 { return uint32(i+1) << 10 }, 200},
		{"ids wrapping 24 bits", false, func(i int) uint32 { return uint32(i+0xfffff0) & 0xffffff }, 50},
		{"one live", true, func(i int) uint32 { return uint32(i + 1) }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := connTable{byQPN: tc.byQPN}
			want := map[uint32]*Conn{}
			var order []*Conn
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range 20 * tc.live {
				c := tableConn(tc.ids(i))
				tab.add(c)
				want[tab.key(c)] = c
				order = append(order, c)
				if len(order) > tc.live { // remove one at random: holes everywhere
					j := rng.IntN(len(order))
					old := order[j]
					order = append(order[:j], order[j+1:]...)
					if !tab.remove(old) {
						t.Fatalf("remove of a live connection (key %d) found nothing", tab.key(old))
					}
					if tab.remove(old) {
						t.Fatalf("a second remove (key %d) found it again", tab.key(old))
					}
					delete(want, tab.key(old))
				}
				checkTable(t, &tab, want)
			}
		})
	}
}

func checkTable(t *testing.T, tab *connTable, want map[uint32]*Conn) {
	t.Helper()
	if tab.live != len(want) {
		t.Fatalf("live = %d, want %d", tab.live, len(want))
	}
	if n := len(*tab.slots.Load()); 2*tab.used > n {
		t.Fatalf("%d of %d slots used: more than half", tab.used, n)
	}
	seen := 0
	for c := range tab.all() {
		if want[tab.key(c)] != c {
			t.Fatalf("all yields key %d, not in the table", tab.key(c))
		}
		seen++
	}
	if seen != len(want) {
		t.Fatalf("all yields %d connections, want %d", seen, len(want))
	}
	for k, c := range want {
		if got := tab.get(k); got != c {
			t.Fatalf("get(%d) = %p, want %p", k, got, c)
		}
		if got := tab.get(k + 1<<24); got != nil { // ids and QP numbers have 24 bits
			t.Fatalf("get(%d) found key %d", k+1<<24, tab.key(got))
		}
	}
}

// TestConnTableReplaces: a connection whose key is taken replaces the other, whose
// remove then leaves the newer one in place.
func TestConnTableReplaces(t *testing.T) {
	var tab connTable
	a, b := tableConn(5), tableConn(5)
	tab.add(a)
	tab.add(b)
	if got := tab.get(5); got != b {
		t.Fatalf("get(5) = %p, want the newer %p", got, b)
	}
	if tab.remove(a) {
		t.Fatal("remove of the replaced connection found it")
	}
	if got := tab.get(5); got != b || tab.live != 1 {
		t.Fatalf("get(5) = %p, live %d; want %p, 1", got, tab.live, b)
	}
}

// TestUnusedID: a connection id comes round after 2^24 connections; one still open keeps
// its id, and so does the shared receive queue (0).
func TestUnusedID(t *testing.T) {
	p := &poller{}
	p.add(tableConn(0xffffff))
	p.add(tableConn(1))
	seq := []uint32{0xffffff, 0, 1, 2}
	got := p.unusedID(func() uint32 {
		id := seq[0]
		seq = seq[1:]
		return id
	})
	if got != 2 {
		t.Fatalf("unusedID = %d, want 2 (0xffffff and 1 open, 0 the shared receives')", got)
	}
}

// TestConnTableReaders: lookups run, without a lock, while connections come and go and
// the table rebuilds; under -race this checks the publication, and every lookup finds
// the connection it asked for or nothing.
func TestConnTableReaders(t *testing.T) {
	var (
		tab  connTable
		mu   sync.Mutex // the poller's mu
		done atomic.Bool
		wg   sync.WaitGroup
	)
	const keep, rounds = 64, 5000
	for range 2 {
		wg.Go(func() {
			for k := uint32(1); !done.Load(); k = k%(rounds+keep) + 1 {
				if c := tab.get(k); c != nil && c.id != k {
					t.Errorf("get(%d) found connection %d", k, c.id)
					return
				}
			}
		})
	}
	var live []*Conn
	for i := range rounds {
		c := tableConn(uint32(i + 1))
		mu.Lock()
		tab.add(c)
		if live = append(live, c); len(live) > keep {
			tab.remove(live[0])
			live = live[1:]
		}
		mu.Unlock()
	}
	done.Store(true)
	wg.Wait()
}

// BenchmarkPollerConns is a poller's share of setting up and tearing down a connection
// while n others stay: one add and one remove per op, the oldest going. The Conn structs
// are reused, so allocs/op are the tables' own.
func BenchmarkPollerConns(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := &poller{}
			p.byQPN.byQPN = true
			ring := make([]*Conn, n)
			for i := range ring {
				ring[i] = tableConn(uint32(i + 1))
				p.add(ring[i])
			}
			next := uint32(n + 1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				slot := i % n
				c := ring[slot]
				p.remove(c)
				c.id, c.qpn = next&0xffffff, (next*7+3)&0xffffff // reused: the table's allocs alone
				next++
				p.add(c)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
		})
	}
}

// BenchmarkPollerLookup is the per-completion lookup among n connections.
func BenchmarkPollerLookup(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := &poller{}
			for i := range n {
				p.add(tableConn(uint32(i + 1)))
			}
			b.ResetTimer()
			for i := range b.N {
				if p.conns.get(uint32(i%n+1)) == nil {
					b.Fatal("lookup missed")
				}
			}
		})
	}
}
