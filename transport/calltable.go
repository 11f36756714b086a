package transport

import "sync/atomic"

// callTable is the client side's calls in flight on a connection (calls, pings, and the
// streams this side opened), by call id. An entry is added before its request is sent and
// removed by whoever completes it first: the response or pong (take), the caller giving up
// (forget), or the connection's failure (drain), which finishes every call it took.
//
// Lock rules: guarded by Conn.mu, but for kept (atomic). A call removed from the table
// belongs to whoever removed it; the others find it gone and wait on its done channel
// instead. Calls done with go back to kept or spare (up to maxSpareCalls) for the next
// ones: kept across garbage collections, unlike in a sync.Pool, whose per-P cache a
// collection drops and the next use allocates again (an allocation per call where large
// payloads make a collection run every call or two).
type callTable struct {
	slots []callSlot // by the low half of a call id
	free  []uint32   // slots to give out again, the latest freed first (its lines are warm)
	n     int        // calls in the table
	spare []*call
	// kept is a call done with, kept by recycle without Conn.mu for the next newLocked: a
	// caller that released its response calls again at once, so most calls come back
	// through it and their recycling takes no lock.
	kept atomic.Pointer[call]
}

// callSlot is one place in the call table: the call in it, or nil, and how many times it
// was given out, the high half of its call's id. A response names its call by id: a late
// one (its call was forgotten, and the slot given to another) finds a different id there.
// A slot given out 2^32 times reuses its ids, long after any response to them.
type callSlot struct {
	gen uint32
	cl  *call
}

// maxSpareCalls bounds the calls a connection keeps for reuse.
const maxSpareCalls = 64

// newLocked returns a spare call, or a new one. Conn.mu is held.
func (t *callTable) newLocked() *call {
	if cl := t.kept.Swap(nil); cl != nil {
		return cl
	}
	if n := len(t.spare); n > 0 {
		cl := t.spare[n-1]
		t.spare[n-1] = nil
		t.spare = t.spare[:n-1]
		return cl
	}
	return &call{done: make(chan struct{}, 1)}
}

// addLocked puts cl in a free slot and gives it that slot's next id: unique on the
// connection, and where to find it again without a hash (a map's insert and delete were
// a twentieth of a small call's CPU on the client). Conn.mu is held.
func (t *callTable) addLocked(cl *call) {
	var i uint32
	if k := len(t.free); k > 0 {
		i = t.free[k-1]
		t.free = t.free[:k-1]
	} else {
		i = uint32(len(t.slots))
		t.slots = append(t.slots, callSlot{})
	}
	s := &t.slots[i]
	s.gen++
	s.cl = cl
	cl.id = uint64(s.gen)<<32 | uint64(i)
	t.n++
}

// lookupLocked returns the call with id, or nil. Conn.mu is held.
func (t *callTable) lookupLocked(id uint64) *call {
	if i := uint32(id); int(i) < len(t.slots) {
		if cl := t.slots[i].cl; cl != nil && cl.id == id {
			return cl
		}
	}
	return nil
}

// removeLocked empties the slot of cl, which is in the table. Conn.mu is held.
func (t *callTable) removeLocked(cl *call) {
	i := uint32(cl.id)
	t.slots[i].cl = nil
	t.free = append(t.free, i)
	t.n--
}

// forgetLocked removes cl; false means it was already gone. Conn.mu is held.
func (t *callTable) forgetLocked(cl *call) bool {
	if t.lookupLocked(cl.id) != cl {
		return false
	}
	t.removeLocked(cl)
	return true
}

// takeLocked removes and returns the call with id, or nil. Conn.mu is held.
func (t *callTable) takeLocked(id uint64) *call {
	cl := t.lookupLocked(id)
	if cl != nil {
		t.removeLocked(cl)
	}
	return cl
}

// lenLocked returns the calls in the table. Conn.mu is held.
func (t *callTable) lenLocked() int { return t.n }

// drainLocked empties the table and returns what it held: the connection failed, and
// each call is the caller's to finish. Conn.mu is held.
func (t *callTable) drainLocked() []*call {
	calls := make([]*call, 0, t.n)
	for i := range t.slots {
		if cl := t.slots[i].cl; cl != nil {
			calls = append(calls, cl)
			t.removeLocked(cl)
		}
	}
	return calls
}

// register adds a call to the call table and returns it, or returns the connection's
// failure.
func (c *Conn) register() (*call, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	cl := c.calls.newLocked()
	c.calls.addLocked(cl)
	return cl, nil
}

// recycle keeps cl, whose caller and signal are done with it, for a later call: in
// callTable.kept if it is empty, else in the spares under Conn.mu.
func (c *Conn) recycle(cl *call) {
	if c.calls.kept.CompareAndSwap(nil, cl) {
		return
	}
	c.mu.Lock()
	if len(c.calls.spare) < maxSpareCalls {
		c.calls.spare = append(c.calls.spare, cl)
	}
	c.mu.Unlock()
}

// forgetCall removes cl from the calls in flight; false means it was already gone (a
// response or a failure took it and will signal done).
func (c *Conn) forgetCall(cl *call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls.forgetLocked(cl)
}

// takeCall removes and returns the call a response answers, or nil for a late one.
func (c *Conn) takeCall(id uint64) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls.takeLocked(id)
}
