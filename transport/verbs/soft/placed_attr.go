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
