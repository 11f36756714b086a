package transport

// serverCalls is the server side's table: the peer's requests being served, by call id,
// and the streams the peer opened. A request enters at dispatch and leaves when its
// serverCall finishes (the handler returned, or the request was refused). A stream enters
// as soon as its opening request's header arrives (openInStream: a large request is READ
// first, and the stream's messages may overtake it) and leaves when its handler is done or
// it was refused (dropInStream).
//
// Lock rules: guarded by Conn.mu. What a cancel or a failure finds here it acts on after
// releasing the lock: a serverCall's context by its generation (the call may have ended and
// its pooled context moved on meanwhile), a stream through its own lock.
type serverCalls struct {
	calls   servedTable
	streams map[uint64]*Stream // nil until the peer opens one
}

// servedTable is the calls being served, by the peer's call id. An mwrpc client numbers
// its calls by the slots of its own call table (callTable: the low half of an id is the
// slot, small and dense), so a served call is kept at that index and found without a hash
// (a map's insert, lookup and delete were about 3% of the server's CPU for a 64 B call
// over shm, two processes on 2 cores). An id whose low half is past maxServedSlots, or
// whose slot another call holds (a peer that numbers its calls some other way), is kept
// in a map instead; the peer cannot make slots longer than maxServedSlots. Guarded by
// Conn.mu.
type servedTable struct {
	slots []*serverCall          // by the low half of the call's id
	more  map[uint64]*serverCall // the calls that are not in slots; nil while there are none
	n     int                    // calls in the table
}

// maxServedSlots bounds servedTable.slots: 1024 calls in flight on one connection, 8 KiB
// of pointers, which is what a peer that picks its ids to grow it makes a connection cost.
const maxServedSlots = 1024

// get returns the call being served under id, or nil.
func (t *servedTable) get(id uint64) *serverCall {
	if i := uint32(id); int(i) < len(t.slots) {
		if sc := t.slots[i]; sc != nil && sc.id == id {
			return sc
		}
	}
	return t.more[id] // a nil map finds nothing
}

// add puts sc, whose id get does not find, in the table.
func (t *servedTable) add(sc *serverCall) {
	t.n++
	if i := uint32(sc.id); i < maxServedSlots {
		if int(i) >= len(t.slots) {
			t.slots = append(t.slots, make([]*serverCall, int(i)+1-len(t.slots))...)
		}
		if t.slots[i] == nil {
			t.slots[i] = sc
			return
		}
	}
	if t.more == nil {
		t.more = make(map[uint64]*serverCall)
	}
	t.more[sc.id] = sc
}

// remove takes sc, which add put in the table, out of it.
func (t *servedTable) remove(sc *serverCall) {
	t.n--
	if i := uint32(sc.id); int(i) < len(t.slots) && t.slots[i] == sc {
		t.slots[i] = nil
		return
	}
	delete(t.more, sc.id)
}

// len is how many calls are being served.
func (t *servedTable) len() int { return t.n }

// each calls f with every call being served.
func (t *servedTable) each(f func(*serverCall)) {
	for _, sc := range t.slots {
		if sc != nil {
			f(sc)
		}
	}
	for _, sc := range t.more {
		f(sc)
	}
}

// servedUse is one use of a handler's pooled context: cancelGen cancels it only if it is
// still that use.
type servedUse struct {
	ctx *callCtx
	gen uint64
}

// snapshotLocked returns what a failing connection must cancel: the contexts of the calls
// being served and the streams the peer opened. Conn.mu is held.
func (s *serverCalls) snapshotLocked() ([]servedUse, []*Stream) {
	serving := make([]servedUse, 0, s.calls.len())
	s.calls.each(func(sc *serverCall) {
		serving = append(serving, servedUse{sc.ctx, sc.ctx.generation()})
	})
	streams := make([]*Stream, 0, len(s.streams))
	for _, st := range s.streams {
		streams = append(streams, st)
	}
	return serving, streams
}

// cancelTargetLocked returns what a cancel for call id reaches: the served call's context and
// its generation, and the stream the peer opened on id. Conn.mu is held.
func (s *serverCalls) cancelTargetLocked(id uint64) (*callCtx, uint64, *Stream) {
	var ctx *callCtx
	var gen uint64
	if sc := s.calls.get(id); sc != nil {
		ctx, gen = sc.ctx, sc.ctx.generation()
	}
	return ctx, gen, s.streams[id]
}
