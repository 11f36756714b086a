package mwnet

import "sync"

// Gathering small writes. A Write goes out at once when no other Write is sending: a lone
// write is never delayed (no Nagle-like timer). Writes that come while another Write holds
// the stream (sending, or waiting for credit or window) are gathered: each is copied into
// the next batch and waits, and the Write that holds the stream sends the batch as one
// message as soon as its own bytes are out, then the batch gathered meanwhile, until none
// is left. Several writers so cost the peer one SEND and one wake-up per batch instead of
// one per Write, exactly when the stream is busy. Each Write's bytes stay contiguous, and
// a gathered Write returns only once its batch was sent (or failed: then none of its bytes
// were, and it returns 0 and the error).
//
// Only Writes up to the stream's eager limit are gathered, into batches of at most that
// many bytes: a batch is one SEND, never a window.

// batch is the bytes of the Writes gathered while another Write sends.
type batch struct {
	buf     []byte
	writers int           // the Writes waiting on it
	done    chan struct{} // closed once the batch was sent or failed
	err     error         // set before done is closed
}

// gatherer holds the batch being gathered; its lock is held only to look at it.
type gatherer struct {
	mu      sync.Mutex
	sending bool   // a Write holds the stream
	next    *batch // gathered, sent when the Write holding the stream is done
	spare   []byte // the buffer of the last batch sent, for the next one
}

// join gathers p into the next batch if a Write holds the stream and the batch has room
// (limit bytes), and returns the batch to wait for; nil means p goes out itself: the
// caller then holds the stream until release.
func (g *gatherer) join(p []byte, limit int) *batch {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.sending {
		g.sending = true
		return nil
	}
	if g.next == nil && len(p) <= limit {
		g.next = &batch{buf: g.spare[:0], done: make(chan struct{})}
		g.spare = nil
	}
	b := g.next
	if b == nil || len(b.buf)+len(p) > limit {
		return nil // too large to gather: it waits for the stream (wmu) like any Write
	}
	b.buf = append(b.buf, p...)
	b.writers++
	return b
}

// take returns the batch gathered so far, or nil when there is none: the Write holding
// the stream then lets go of it.
func (g *gatherer) take() *batch {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.next
	g.next = nil
	if b == nil {
		g.sending = false
	}
	return b
}

// sent completes a batch and keeps its buffer for the next one.
func (g *gatherer) sent(b *batch, err error) {
	b.err = err
	close(b.done)
	g.mu.Lock()
	if g.spare == nil {
		g.spare = b.buf[:0]
	}
	g.mu.Unlock()
}
