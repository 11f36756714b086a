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
	calls   map[uint64]*serverCall
	streams map[uint64]*Stream // nil until the peer opens one
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
	serving := make([]servedUse, 0, len(s.calls))
	for _, sc := range s.calls {
		serving = append(serving, servedUse{sc.ctx, sc.ctx.generation()})
	}
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
	if sc := s.calls[id]; sc != nil {
		ctx, gen = sc.ctx, sc.ctx.generation()
	}
	return ctx, gen, s.streams[id]
}
