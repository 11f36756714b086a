package soft

// PlacesTransfers reports whether the QP's wire is shared memory (SharedMemoryWire, the
// shm fabric), over which an RDMA READ or WRITE of memory the peer mapped is placed: one
// copy by the owner of the memory reached, and no payload through the stream. A READ then
// costs its responder a copy rather than a round trip's worth of bytes, and the transport
// keeps READing large requests there instead of granting memory to write them into.
func (q *QP) PlacesTransfers() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stream != nil { // attached, not yet started
		_, ok := q.stream.(SharedMemoryWire)
		return ok
	}
	return sharedWire(q.link) != nil
}

// PeerCopies tells the QP's wire, when it is shared memory, that the peer copies n bytes
// (a placed WRITE it pulls) before it next answers (SharedMemoryWire.PeerCopies): its
// user knows when an answer waits on such a copy (a lone call's), the QP does not. Other
// wires ignore it.
func (q *QP) PeerCopies(n int) {
	q.mu.Lock()
	sw := sharedWire(q.link)
	q.mu.Unlock()
	if sw != nil {
		sw.PeerCopies(n)
	}
}

// PlaceLargeSends says whether SENDs larger than PlacedSendMax are placed too over a
// SharedMemoryWire (off until told). Placing pays while the connection has several
// messages in flight: one copy per message instead of two, less CPU for each (64 KiB over
// shm on 2 cores: 1.1-1.9x the calls at 16 callers, 1.5-1.6x at 64); a lone call's request
// is faster through the stream, where the copies overlap (see PlacedSendMax). The QP cannot tell
// which its SENDs are, its user can: the transport says it before each large SEND it
// posts. It applies to the SENDs posted after it (each keeps what it was posted with);
// safe for concurrent use.
func (q *QP) PlaceLargeSends(on bool) {
	if q.placeLarge.Load() != on { // most posts change nothing: no store to share
		q.placeLarge.Store(on)
	}
}
