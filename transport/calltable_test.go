package transport

import "testing"

// TestCallTable: ids are unique while slots are reused; a call is found by its id until
// it is taken or forgotten, and a late response's id (its call gone, its slot given to
// another) finds nothing; a drain returns every call left.
func TestCallTable(t *testing.T) {
	var tb callTable
	add := func() *call {
		cl := tb.newLocked()
		tb.addLocked(cl)
		return cl
	}
	a, b := add(), add()
	if a.id == b.id || a.id == 0 || b.id == 0 {
		t.Fatalf("ids %d and %d: want two distinct non-zero ids", a.id, b.id)
	}
	old := a.id
	if got := tb.takeLocked(old); got != a {
		t.Fatalf("take(%d) = %p, want the call %p", old, got, a)
	}
	if tb.takeLocked(old) != nil {
		t.Fatal("a call was taken twice")
	}
	c := add() // reuses a's slot
	if c.id == old || uint32(c.id) != uint32(old) {
		t.Fatalf("the slot freed by id %#x gave id %#x: want the same slot, a new id", old, c.id)
	}
	if tb.takeLocked(old) != nil || tb.lookupLocked(old) != nil {
		t.Fatal("a late response's id found the call now in its slot")
	}
	if !tb.forgetLocked(b) || tb.forgetLocked(b) {
		t.Fatal("forget: want true once, then false")
	}
	for _, id := range []uint64{0, 1 << 40, uint64(len(tb.slots)) + 5, ^uint64(0)} {
		if tb.lookupLocked(id) != nil {
			t.Fatalf("lookup of id %#x, never given out, found a call", id)
		}
	}
	d := add()
	if n := tb.lenLocked(); n != 2 {
		t.Fatalf("%d calls in the table, want 2", n)
	}
	left := tb.drainLocked()
	if len(left) != 2 || !(left[0] == c && left[1] == d || left[0] == d && left[1] == c) || tb.lenLocked() != 0 {
		t.Fatalf("drain returned %d calls and left %d, want c and d, and none", len(left), tb.lenLocked())
	}
	if tb.lookupLocked(c.id) != nil || tb.lookupLocked(d.id) != nil {
		t.Fatal("a drained call is still found")
	}
	seen := make(map[uint64]bool)
	for range 1000 { // churn: ids never repeat while slots are reused
		cl := add()
		if seen[cl.id] {
			t.Fatalf("id %#x given out twice", cl.id)
		}
		seen[cl.id] = true
		if tb.takeLocked(cl.id) != cl {
			t.Fatal("a call was not found by its id")
		}
	}
	if len(tb.slots) > 4 {
		t.Fatalf("%d slots after one call at a time, want the freed ones reused", len(tb.slots))
	}
}

// TestRecycleKeepsWithoutLock: a call done with is kept without Conn.mu when the kept
// place is empty, and the next call registered is that one; a second one goes to the
// spares under the lock.
func TestRecycleKeepsWithoutLock(t *testing.T) {
	e := newEnv(t, tcpFabric, echo, Config{})
	c := e.conn
	a, err := c.register()
	if err != nil {
		t.Fatal(err)
	}
	if !c.forgetCall(a) {
		t.Fatal("a registered call was not in the table")
	}
	doneWhileLocked(t, &c.mu, "recycling a call into an empty kept place", func() { c.recycle(a) })
	c.mu.Lock()
	spares := len(c.calls.spare)
	c.mu.Unlock()
	b, err := c.register()
	if err != nil {
		t.Fatal(err)
	}
	if b != a {
		t.Fatal("the next call registered is not the call kept")
	}
	if !c.forgetCall(b) {
		t.Fatal("a registered call was not in the table")
	}
	c.recycle(b)
	other := &call{done: make(chan struct{}, 1)}
	c.recycle(other) // the kept place is full: a spare
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.calls.spare) != spares+1 || c.calls.spare[len(c.calls.spare)-1] != other {
		t.Fatalf("spares %d after a second recycle, want %d ending with it", len(c.calls.spare), spares+1)
	}
}
