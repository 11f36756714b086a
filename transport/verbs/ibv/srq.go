//go:build ibverbs && linux && cgo

package ibv

/*
#include "mwibv.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// srq is a shared receive queue (ibv_srq). It implements verbs.SRQ.
type srq struct {
	dev   *Device
	pd    *pd
	c     *C.struct_ibv_srq
	attr  verbs.SRQAttr
	users verbs.Users // attached QPs

	// PostRecv's C memory, guarded by mu, as a QP's receive side.
	mu        sync.Mutex
	rq        *C.struct_mwibv_rq
	rwr       []C.struct_ibv_recv_wr
	rsge      []C.struct_ibv_sge
	perWR     int
	destroyed bool

	limitCh chan struct{} // IBV_EVENT_SRQ_LIMIT_REACHED
}

// CreateSRQ creates a shared receive queue with ibv_create_srq (verbs.SRQCreator). Cap()
// reports what the device made (ibv_query_srq), which may exceed what was asked for.
func (p *pd) CreateSRQ(a verbs.SRQAttr) (verbs.SRQ, error) {
	d := p.dev
	lim := d.attr
	switch {
	case lim.MaxSRQ == 0:
		return nil, fmt.Errorf("ibv: create SRQ: device %s has no shared receive queues: %w", d.name, verbs.ErrUnsupported)
	case a.MaxWR <= 0 || a.MaxWR > lim.MaxSRQWR:
		return nil, fmt.Errorf("ibv: create SRQ: max_wr %d outside 1..%d: %w", a.MaxWR, lim.MaxSRQWR, verbs.ErrInvalid)
	case a.MaxSGE < 0 || a.MaxSGE > lim.MaxSRQSGE:
		return nil, fmt.Errorf("ibv: create SRQ: max_sge %d outside 0..%d: %w", a.MaxSGE, lim.MaxSRQSGE, verbs.ErrInvalid)
	}
	if err := p.use(); err != nil {
		return nil, err
	}
	var ia C.struct_ibv_srq_init_attr
	ia.attr.max_wr = C.uint32_t(a.MaxWR)
	ia.attr.max_sge = C.uint32_t(a.MaxSGE)
	c, err := C.ibv_create_srq(p.c, &ia)
	if c == nil {
		p.unuse()
		return nil, errnoErr(fmt.Sprintf("%s: create SRQ %+v", d.name, a), cErr(err))
	}
	got := a
	var sa C.struct_ibv_srq_attr
	if C.ibv_query_srq(c, &sa) == 0 {
		got.MaxWR = max(got.MaxWR, int(sa.max_wr))
		got.MaxSGE = max(got.MaxSGE, int(sa.max_sge))
	}
	s := &srq{dev: d, pd: p, c: c, attr: got, perWR: max(got.MaxSGE, 1), limitCh: make(chan struct{}, 1)}
	n := min(got.MaxWR, maxBatch)
	s.rq = C.mwibv_srq_alloc(c, C.int(n), C.int(got.MaxSGE))
	if s.rq == nil {
		C.ibv_destroy_srq(c)
		p.unuse()
		return nil, fmt.Errorf("ibv: create SRQ: allocate %d work request slots: %w", n, verbs.ErrNoMemory)
	}
	s.rwr = unsafe.Slice(s.rq.wr, n)
	s.rsge = unsafe.Slice(s.rq.sge, n*s.perWR)
	d.mu.Lock()
	d.srqs[uintptr(unsafe.Pointer(c))] = s
	d.mu.Unlock()
	return s, nil
}

// ArmLimit arms the SRQ's limit with ibv_modify_srq (IBV_SRQ_LIMIT). The kernel sends
// IBV_EVENT_SRQ_LIMIT_REACHED, which the device's event watcher turns into a token on
// LimitReached.
func (s *srq) ArmLimit(n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.destroyed:
		return fmt.Errorf("ibv: arm SRQ limit: %w", verbs.ErrClosed)
	case n < 0 || n > s.attr.MaxWR:
		return fmt.Errorf("ibv: arm SRQ limit %d (0..%d): %w", n, s.attr.MaxWR, verbs.ErrInvalid)
	}
	var a C.struct_ibv_srq_attr
	a.srq_limit = C.uint32_t(n)
	if rc := C.ibv_modify_srq(s.c, &a, C.IBV_SRQ_LIMIT); rc != 0 {
		return errnoErr(fmt.Sprintf("arm SRQ limit %d", n), syscall.Errno(rc))
	}
	return nil
}

// LimitReached returns the channel the armed limit signals on.
func (s *srq) LimitReached() <-chan struct{} { return s.limitCh }

func (s *srq) limitReached() {
	select {
	case s.limitCh <- struct{}{}:
	default:
	}
}

// Cap returns the capacities the device granted.
func (s *srq) Cap() verbs.SRQAttr { return s.attr }

// PD returns the SRQ's protection domain.
func (s *srq) PD() verbs.PD { return s.pd }

// PostRecv posts receives, up to maxBatch per ibv_post_srq_recv.
func (s *srq) PostRecv(wrs []verbs.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return &verbs.PostError{Op: "post_srq_recv", Index: 0, Err: fmt.Errorf("ibv: SRQ: %w", verbs.ErrClosed)}
	}
	done := 0
	for done < len(wrs) {
		n, tooMany := fillRecvs(s.rwr, s.rsge, s.perWR, s.attr.MaxSGE, wrs[done:])
		var perr error
		if tooMany {
			perr = fmt.Errorf("ibv: SRQ receive with %d SGEs (max_sge %d): %w", len(wrs[done+n].SGL), s.attr.MaxSGE, verbs.ErrInvalid)
		}
		if n > 0 {
			if rc := C.mwibv_post_recv(s.rq, C.int(n)); rc != 0 {
				return &verbs.PostError{Op: "post_srq_recv", Index: done + int(s.rq.bad), Err: srqPostErr(syscall.Errno(rc))}
			}
		}
		if perr != nil {
			return &verbs.PostError{Op: "post_srq_recv", Index: done + n, Err: perr}
		}
		done += n
	}
	return nil
}

func srqPostErr(e syscall.Errno) error {
	if e == syscall.ENOMEM {
		return fmt.Errorf("ibv: SRQ: post_srq_recv: work queue full: %w: %w", verbs.ErrQueueFull, e)
	}
	return errnoErr("SRQ: post_srq_recv", e)
}

// Destroy releases the SRQ (ibv_destroy_srq). It fails with verbs.ErrBusy while QPs use
// it (the kernel would return EBUSY).
func (s *srq) Destroy() error {
	err := s.users.Close("ibv: destroy SRQ", "QPs", func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if rc := C.ibv_destroy_srq(s.c); rc != 0 {
			return errnoErr("destroy SRQ", syscall.Errno(rc))
		}
		s.destroyed = true
		d := s.dev
		d.mu.Lock()
		delete(d.srqs, uintptr(unsafe.Pointer(s.c)))
		d.mu.Unlock()
		C.mwibv_rq_free(s.rq)
		s.rq, s.rwr, s.rsge = nil, nil, nil
		return nil
	})
	if err != nil {
		return err
	}
	s.pd.unuse()
	return nil
}
