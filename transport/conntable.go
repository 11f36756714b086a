package transport

import (
	"iter"
	"sync/atomic"
)

// connTable maps a key of a connection (its id, or its QP number) to the connection, for a
// poller: every completion is looked up in it, and connections come and go while it is.
//
// A lookup takes no lock: one atomic load of the slot array, then a linear probe of
// atomic loads from the key's hash. Writers (add, remove) hold the poller's mu and change
// one slot in place, so setting up or tearing down a connection costs O(1) amortized: the
// array is rebuilt (copied, without tombstones, to four times the live connections) only
// when connections and tombstones would fill half of it, which at least a quarter of its
// size of adds or removes has to do first. A reader that loaded the
// array just before a rebuild finds what it held then, as with a copied map.
//
// A removed connection leaves a tombstone (connGone), so that probes for keys placed
// beyond it go on. The key is read from the connection itself (id or qpn, set before it
// is added and never changed), so a slot needs no key of its own.
type connTable struct {
	byQPN bool                                   // keyed by Conn.qpn, else by Conn.id
	slots atomic.Pointer[[]atomic.Pointer[Conn]] // length a power of two
	live  int                                    // connections in slots (writers')
	used  int                                    // connections and tombstones in slots (writers')
}

// connGone marks a slot whose connection was removed.
var connGone = new(Conn)

// connTableMin is the smallest slot array: a poller with a handful of connections.
const connTableMin = 16

func (t *connTable) key(c *Conn) uint32 {
	if t.byQPN {
		return c.qpn
	}
	return c.id
}

// home is where the probe for k starts in n slots: the top bits of a multiplicative hash,
// so that dense keys (ids are counted, QP numbers often are) and sparse ones spread alike.
func home(k uint32, n int) int {
	return int(uint64(k*0x9e3779b1) * uint64(n) >> 32)
}

// get returns the connection with key k, or nil.
func (t *connTable) get(k uint32) *Conn {
	sp := t.slots.Load()
	if sp == nil {
		return nil
	}
	s := *sp
	mask := len(s) - 1
	for i := home(k, len(s)); ; i = (i + 1) & mask {
		c := s[i].Load()
		switch {
		case c == nil:
			return nil
		case c != connGone && t.key(c) == k:
			return c
		}
	}
}

// all yields every connection in the table as of the call (the poller's reap and failure
// paths, and rebuild).
func (t *connTable) all() iter.Seq[*Conn] {
	return func(yield func(*Conn) bool) {
		sp := t.slots.Load()
		if sp == nil {
			return
		}
		for i := range *sp {
			if c := (*sp)[i].Load(); c != nil && c != connGone && !yield(c) {
				return
			}
		}
	}
}

// add puts c in the table, in place of a connection with the same key (the newer one is
// whose completions come now). The caller holds the poller's mu.
func (t *connTable) add(c *Conn) {
	if sp := t.slots.Load(); sp == nil || 2*(t.used+1) > len(*sp) {
		t.rebuild()
	}
	s := *t.slots.Load()
	mask, k := len(s)-1, t.key(c)
	free := -1 // the first tombstone on the probe, reused if k is not further on
	for i := home(k, len(s)); ; i = (i + 1) & mask {
		old := s[i].Load()
		switch {
		case old == nil:
			if free < 0 {
				free = i
				t.used++
			}
			s[free].Store(c)
			t.live++
			return
		case old == connGone:
			if free < 0 {
				free = i
			}
		case t.key(old) == k:
			s[i].Store(c)
			return
		}
	}
}

// remove takes c out of the table and reports whether it was there (it is not if it was
// never added, was removed before, or a connection with its key replaced it). The caller
// holds the poller's mu.
func (t *connTable) remove(c *Conn) bool {
	sp := t.slots.Load()
	if sp == nil {
		return false
	}
	s := *sp
	mask := len(s) - 1
	for i := home(t.key(c), len(s)); ; i = (i + 1) & mask {
		switch s[i].Load() {
		case nil:
			return false
		case c:
			s[i].Store(connGone)
			t.live--
			return true
		}
	}
}

// rebuild publishes a new slot array of four times the live connections (at least
// connTableMin), without tombstones. Readers of the old one finish on it undisturbed.
func (t *connTable) rebuild() {
	n := connTableMin
	for n < 4*(t.live+1) {
		n *= 2
	}
	s := make([]atomic.Pointer[Conn], n)
	mask := n - 1
	for c := range t.all() {
		i := home(t.key(c), n)
		for s[i].Load() != nil {
			i = (i + 1) & mask
		}
		s[i].Store(c)
	}
	t.used = t.live
	t.slots.Store(&s)
}
