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
