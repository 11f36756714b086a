//go:build ibverbs && linux && cgo

package ibv

/*
#include <stdlib.h>
#include "mwibv.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// maxPoll bounds the completions one cgo call polls; Poll with a longer slice takes at
// most this many per call.
const maxPoll = 256

// cq is a completion queue (ibv_cq) with its own completion channel. It implements
// verbs.CQ.
type cq struct {
	dev    *Device
	c      *C.struct_ibv_cq
	ch     *C.struct_ibv_comp_channel
	n      atomic.Int32 // the queue's size (ibv_cq.cqe), changed by Resize
	notify chan struct{}

	// Poll's C memory, guarded by mu.
	mu      sync.Mutex
	scratch *C.struct_ibv_wc
	out     []C.struct_mwibv_wc
	closed  bool

	wmu   sync.Mutex
	watch *fdWatch // started by the first ReqNotify
	users int      // QPs; wmu
}

// CreateCQ creates a completion queue for at least cqe completions, with a completion
// channel for ReqNotify and Notify.
func (d *Device) CreateCQ(cqe int) (verbs.CQ, error) {
	if cqe <= 0 || cqe > d.attr.MaxCQE {
		return nil, fmt.Errorf("ibv: create CQ of %d entries (1..%d): %w", cqe, d.attr.MaxCQE, verbs.ErrInvalid)
	}
	if err := d.use(); err != nil {
		return nil, err
	}
	ch, err := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		d.unuse()
		return nil, errnoErr(d.name+": create completion channel", cErr(err))
	}
	c, err := C.ibv_create_cq(d.ctx, C.int(cqe), nil, ch, 0)
	if c == nil {
		C.ibv_destroy_comp_channel(ch)
		d.unuse()
		return nil, errnoErr(fmt.Sprintf("%s: create CQ of %d entries", d.name, cqe), cErr(err))
	}
	np := min(cqe, maxPoll)
	scratch := (*C.struct_ibv_wc)(C.calloc(C.size_t(np), C.size_t(unsafe.Sizeof(C.struct_ibv_wc{}))))
	out := (*C.struct_mwibv_wc)(C.calloc(C.size_t(np), C.size_t(unsafe.Sizeof(C.struct_mwibv_wc{}))))
	if scratch == nil || out == nil {
		C.free(unsafe.Pointer(scratch))
		C.free(unsafe.Pointer(out))
		C.ibv_destroy_cq(c)
		C.ibv_destroy_comp_channel(ch)
		d.unuse()
		return nil, fmt.Errorf("ibv: create CQ: %w", verbs.ErrNoMemory)
	}
	q := &cq{dev: d, c: c, ch: ch, notify: make(chan struct{}, 1), scratch: scratch, out: unsafe.Slice(out, np)}
	q.n.Store(int32(c.cqe))
	return q, nil
}

// Cap returns the number of completions the queue holds.
func (q *cq) Cap() int { return int(q.n.Load()) }

// Resize implements verbs.CQResizer with ibv_resize_cq, under the lock Poll holds: a
// provider may move the queue's buffer (mlx5 copies the queued entries to a new one).
// Poll's scratch space stays at its size; it bounds one poll, not the queue.
func (q *cq) Resize(cqe int) error {
	if cqe <= 0 || cqe > q.dev.attr.MaxCQE {
		return fmt.Errorf("ibv: resize CQ to %d entries (1..%d): %w", cqe, q.dev.attr.MaxCQE, verbs.ErrInvalid)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("ibv: resize CQ: %w", verbs.ErrClosed)
	}
	if cqe <= int(q.c.cqe) {
		return nil
	}
	if rc := C.ibv_resize_cq(q.c, C.int(cqe)); rc != 0 {
		return errnoErr(fmt.Sprintf("%s: resize CQ to %d entries", q.dev.name, cqe), syscall.Errno(rc))
	}
	q.n.Store(int32(q.c.cqe))
	return nil
}

// Notify returns the channel ReqNotify arms.
func (q *cq) Notify() <-chan struct{} { return q.notify }

// ReqNotify arms the queue (ibv_req_notify_cq): the next completion sends one token on
// Notify's channel.
func (q *cq) ReqNotify() error {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	q.mu.Lock()
	closed := q.closed
	q.mu.Unlock()
	if closed {
		return fmt.Errorf("ibv: req notify: %w", verbs.ErrClosed)
	}
	if q.watch == nil {
		w, err := watchFD(int(q.ch.fd), q.event)
		if err != nil {
			return fmt.Errorf("ibv: watch completion channel: %w", err)
		}
		q.watch = w
	}
	if rc := C.ibv_req_notify_cq(q.c, 0); rc != 0 {
		return errnoErr("req notify CQ", syscall.Errno(rc))
	}
	return nil
}

// event takes one completion event (acknowledging it) and signals Notify's channel.
func (q *cq) event() (more bool) {
	if C.mwibv_cq_event(q.ch) != 0 {
		return false
	}
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return true
}

// Poll moves up to len(wcs) completions (at most maxPoll) into wcs with one cgo call. It
// does not allocate.
func (q *cq) Poll(wcs []verbs.WorkCompletion) (int, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, fmt.Errorf("ibv: poll CQ: %w", verbs.ErrClosed)
	}
	n := min(len(wcs), len(q.out))
	if n == 0 {
		q.mu.Unlock()
		return 0, nil
	}
	k := int(C.mwibv_poll(q.c, q.scratch, &q.out[0], C.int(n)))
	if k < 0 {
		q.mu.Unlock()
		return 0, errnoErr("poll CQ", syscall.Errno(-k))
	}
	var special bool
	for i := 0; i < k; i++ {
		o := &q.out[i]
		wc := verbs.WorkCompletion{
			WRID:      uint64(o.wr_id),
			Status:    verbs.WCStatus(o.status),
			Opcode:    verbs.WCOpcode(o.opcode),
			Flags:     q.flags(uint32(o.flags)),
			ByteLen:   uint32(o.byte_len),
			QPNum:     uint32(o.qp_num),
			VendorErr: uint32(o.vendor_err),
		}
		switch {
		case wc.Status != verbs.WCSuccess:
			wc.Opcode = verbs.WCOpcodeUnknown // undefined for an error completion
			special = true
		case wc.Flags&verbs.WCWithImm != 0:
			wc.ImmData = uint32(o.imm_inv)
		case wc.Flags&verbs.WCWithInv != 0:
			wc.InvalidatedRKey = uint32(o.imm_inv)
			special = true
		}
		wcs[i] = wc
	}
	q.mu.Unlock()
	if special {
		q.bookkeep(wcs[:k])
	}
	return k, nil
}

// flags converts ibv_wc_flags. rxe writes the kernel's ib_wc_flags into user-space
// completions unchanged (rxe_resp.c do_complete, rdma-core's rxe_poll_cq copies them), and
// there IB_WC_WITH_INVALIDATE is 1<<2, which libibverbs calls IBV_WC_IP_CSUM_OK, while
// IBV_WC_WITH_INV is 1<<3 (the kernel's IB_WC_IP_CSUM_OK).
func (q *cq) flags(f uint32) verbs.WCFlags {
	const (
		grh    = 1 << 0 // the same in both
		imm    = 1 << 1 // the same in both
		kInv   = 1 << 2 // IB_WC_WITH_INVALIDATE
		ibvInv = 1 << 3 // IBV_WC_WITH_INV
	)
	var w verbs.WCFlags
	if f&grh != 0 {
		w |= verbs.WCWithGRH
	}
	if f&imm != 0 {
		w |= verbs.WCWithImm
	}
	if (q.dev.rxe && f&kInv != 0) || (!q.dev.rxe && f&ibvInv != 0) {
		w |= verbs.WCWithInv
	}
	return w
}

// bookkeep updates the provider's view from completions: an error moves its QP to ERR, a
// received SEND_WITH_INV unbinds its window.
func (q *cq) bookkeep(wcs []verbs.WorkCompletion) {
	for i := range wcs {
		wc := &wcs[i]
		switch {
		case wc.Status != verbs.WCSuccess:
			q.dev.markError(wc.QPNum, nil)
		case wc.Flags&verbs.WCWithInv != 0:
			q.dev.invalidated(wc.InvalidatedRKey)
		}
	}
}

func (q *cq) use() error {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	q.mu.Lock()
	closed := q.closed
	q.mu.Unlock()
	if closed {
		return fmt.Errorf("ibv: CQ: %w", verbs.ErrClosed)
	}
	q.users++
	return nil
}

func (q *cq) unuse() {
	q.wmu.Lock()
	q.users--
	q.wmu.Unlock()
}

// Destroy releases the queue and its completion channel. QPs using it must be destroyed
// first (verbs.ErrBusy).
func (q *cq) Destroy() error {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("ibv: destroy CQ: %w", verbs.ErrClosed)
	}
	if q.users > 0 {
		return fmt.Errorf("ibv: destroy CQ: %d QPs still use it: %w", q.users, verbs.ErrBusy)
	}
	q.watch.stop() // every event taken was acknowledged, which ibv_destroy_cq waits for
	q.watch = nil
	if rc := C.ibv_destroy_cq(q.c); rc != 0 {
		return errnoErr("destroy CQ", syscall.Errno(rc))
	}
	if rc := C.ibv_destroy_comp_channel(q.ch); rc != 0 {
		return errnoErr("destroy completion channel", syscall.Errno(rc))
	}
	q.closed = true
	C.free(unsafe.Pointer(q.scratch))
	C.free(unsafe.Pointer(&q.out[0]))
	q.scratch, q.out = nil, nil
	q.dev.unuse()
	return nil
}
