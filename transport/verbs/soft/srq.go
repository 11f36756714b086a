package soft

import (
	"fmt"
	"sync"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Limits of a soft device's shared receive queues.
const (
	maxSRQ   = 1 << 16
	maxSRQWR = maxQPWR
)

// srq is a shared receive queue: a ring of receives, consumed in post order by the
// responders of every QP attached to it (rxe's get_srq_wqe), or, created with AnyOrder,
// newest first: a stack, so that a receive posted again at once is the next one taken
// while its buffer is still in the caches. Its own mutex keeps the QPs' readers from
// contending on anything else; a responder takes it inside its QP's mu.
type srq struct {
	dev    *Device
	pd     *pd
	domain *parentDomain // created on it (its count), or nil
	attr   verbs.SRQAttr
	users  verbs.Users // attached QPs
	db     doorbell    // mu; from the parent domain's allocator, if it has one

	mu        sync.Mutex
	ring      []rwqe
	head      uint64
	tail      uint64
	limit     uint64 // armed: signal limitCh once fewer receives remain; 0 when not
	limitCh   chan struct{}
	destroyed bool
}

// CreateSRQ creates a shared receive queue (verbs.SRQCreator).
func (p *pd) CreateSRQ(a verbs.SRQAttr) (verbs.SRQ, error) {
	switch {
	case a.MaxWR <= 0 || a.MaxWR > maxSRQWR:
		return nil, fmt.Errorf("soft: create SRQ: max_wr %d outside 1..%d: %w", a.MaxWR, maxSRQWR, verbs.ErrInvalid)
	case a.MaxSGE < 0 || a.MaxSGE > maxSGE:
		return nil, fmt.Errorf("soft: create SRQ: max_sge %d outside 0..%d: %w", a.MaxSGE, maxSGE, verbs.ErrInvalid)
	}
	d := p.dev
	d.mu.Lock()
	switch {
	case d.closed:
		d.mu.Unlock()
		return nil, fmt.Errorf("soft: create SRQ: device %s: %w", d.name, verbs.ErrClosed)
	case d.srqs >= maxSRQ:
		d.mu.Unlock()
		return nil, fmt.Errorf("soft: create SRQ: device %s has %d (max_srq): %w", d.name, d.srqs, verbs.ErrNoMemory)
	}
	d.srqs++
	d.mu.Unlock()
	if err := p.use(); err != nil {
		d.unuseSRQ()
		return nil, err
	}
	s := &srq{dev: d, pd: p, attr: a, ring: make([]rwqe, a.MaxWR), limitCh: make(chan struct{}, 1)}
	for i := range s.ring {
		s.ring[i].sges = make([]verbs.SGE, 0, a.MaxSGE)
	}
	return s, nil
}

func (d *Device) unuseSRQ() {
	d.mu.Lock()
	d.srqs--
	d.mu.Unlock()
}

// Cap returns the capacities the SRQ was created with.
func (s *srq) Cap() verbs.SRQAttr { return s.attr }

// PD returns the SRQ's protection domain.
func (s *srq) PD() verbs.PD { return s.pd }

// PostRecv queues receives for the attached QPs, in order.
func (s *srq) PostRecv(wrs []verbs.RecvWR) error {
	if s.domain != nil && s.domain.td != nil {
		s.domain.td.enter()
		defer s.domain.td.exit()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() { s.db.ring(0, s.tail) }()
	for i := range wrs {
		if err := s.post(&wrs[i]); err != nil {
			return &verbs.PostError{Op: "post_srq_recv", Index: i, Err: err}
		}
	}
	return nil
}

func (s *srq) post(wr *verbs.RecvWR) error {
	switch {
	case s.destroyed:
		return fmt.Errorf("soft: SRQ: %w", verbs.ErrClosed)
	case len(wr.SGL) > s.attr.MaxSGE:
		return fmt.Errorf("soft: SRQ receive with %d SGEs (max_sge %d): %w", len(wr.SGL), s.attr.MaxSGE, verbs.ErrInvalid)
	case s.tail-s.head >= uint64(len(s.ring)):
		return fmt.Errorf("soft: SRQ: %d receives posted (max_wr): %w", len(s.ring), verbs.ErrQueueFull)
	}
	r := &s.ring[s.tail%uint64(len(s.ring))]
	r.wrid = wr.WRID
	r.sges = append(r.sges[:0], wr.SGL...)
	s.tail++
	return nil
}

// take moves the oldest receive (with AnyOrder, the newest) into dst (whose sges it
// reuses) and reports whether there was one. The copy frees the slot at once: a poster may
// fill it while the taker places the payload.
func (s *srq) take(dst *rwqe) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == s.tail {
		return false
	}
	var r *rwqe
	if s.attr.AnyOrder {
		s.tail--
		r = &s.ring[s.tail%uint64(len(s.ring))]
	} else {
		r = &s.ring[s.head%uint64(len(s.ring))]
		s.head++
	}
	dst.wrid = r.wrid
	dst.sges = append(dst.sges[:0], r.sges...)
	if s.limit > 0 && s.tail-s.head < s.limit {
		s.limit = 0 // one event per arming, as IBV_EVENT_SRQ_LIMIT_REACHED
		select {
		case s.limitCh <- struct{}{}:
		default:
		}
	}
	return true
}

// ArmLimit arms the limit: once a receive is taken and fewer than n remain, LimitReached
// gets a token. As on rxe, arming does not look at the receives posted: a limit above
// them fires when the next receive is taken, not at once.
func (s *srq) ArmLimit(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.destroyed:
		return fmt.Errorf("soft: arm SRQ limit: %w", verbs.ErrClosed)
	case n < 0 || n > s.attr.MaxWR:
		return fmt.Errorf("soft: arm SRQ limit %d (0..%d): %w", n, s.attr.MaxWR, verbs.ErrInvalid)
	}
	s.limit = uint64(n)
	return nil
}

// LimitReached returns the channel the armed limit signals on.
func (s *srq) LimitReached() <-chan struct{} { return s.limitCh }

// Destroy releases the SRQ; it fails with verbs.ErrBusy while QPs are attached. Posted
// receives are dropped without completions.
func (s *srq) Destroy() error {
	err := s.users.Close("soft: destroy SRQ", "QPs", func() error {
		s.mu.Lock()
		s.destroyed = true
		s.head = s.tail
		db := s.db
		s.db = doorbell{}
		s.mu.Unlock()
		db.free()
		return nil
	})
	if err != nil {
		return err
	}
	s.pd.unuse()
	s.domain.release()
	s.dev.unuseSRQ()
	return nil
}
