package transport

// callTable is the client side's calls in flight on a connection (calls, pings, and the
// streams this side opened), by call id. An entry is added before its request is sent and
// removed by whoever completes it first: the response or pong (take), the caller giving up
// (forget), or the connection's failure (drain), which finishes every call it took.
//
// Lock rules: guarded by Conn.mu. A call removed from the table belongs to whoever removed
// it; the others find it gone and wait on its done channel instead. Calls done with go
// back to spare, up to maxSpareCalls, for the next ones: kept across garbage collections,
// unlike in a sync.Pool, whose per-P cache a collection drops and the next use allocates
// again (an allocation per call where large payloads make a collection run every call or
// two).
type callTable struct {
	byID   map[uint64]*call
	nextID uint64 // the last id given out; ids are unique on the connection
	spare  []*call
}

// maxSpareCalls bounds the calls a connection keeps for reuse.
const maxSpareCalls = 64

// newLocked returns a spare call, or a new one. Conn.mu is held.
func (t *callTable) newLocked() *call {
	if n := len(t.spare); n > 0 {
		cl := t.spare[n-1]
		t.spare[n-1] = nil
		t.spare = t.spare[:n-1]
		return cl
	}
	return &call{done: make(chan struct{}, 1)}
}

// addLocked gives cl the next call id and records it. Conn.mu is held.
func (t *callTable) addLocked(cl *call) {
	t.nextID++
	cl.id = t.nextID
	t.byID[cl.id] = cl
}

// forgetLocked removes cl; false means it was already gone. Conn.mu is held.
func (t *callTable) forgetLocked(cl *call) bool {
	if t.byID[cl.id] != cl {
		return false
	}
	delete(t.byID, cl.id)
	return true
}

// takeLocked removes and returns the call with id, or nil. Conn.mu is held.
func (t *callTable) takeLocked(id uint64) *call {
	cl := t.byID[id]
	if cl != nil {
		delete(t.byID, id)
	}
	return cl
}

// drainLocked empties the table and returns what it held: the connection failed, and
// each call is the caller's to finish. Conn.mu is held.
func (t *callTable) drainLocked() map[uint64]*call {
	calls := t.byID
	t.byID = make(map[uint64]*call)
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

// recycle keeps cl, whose caller and signal are done with it, for a later call.
func (c *Conn) recycle(cl *call) {
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
