//go:build ibverbs && linux && cgo

package ibv

/*
#include <stdlib.h>
#include "mwibv.h"
*/
import "C"

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// maxBatch bounds the work requests one cgo call posts; longer slices are posted in
// batches of this size (each batch is one ibv_post_send or ibv_post_recv).
const maxBatch = 256

// Defaults for QPAttr fields left zero, as the soft provider's.
const (
	defaultTimeout  = time.Second
	defaultRNRTimer = 10 * time.Microsecond
	defaultPathMTU  = 1024
	udQKey          = 0x11111111
)

// qp is a queue pair (ibv_qp). It implements verbs.QP.
type qp struct {
	dev    *Device
	pd     *pd
	c      *C.struct_ibv_qp
	typ    verbs.QPType
	scq    *cq
	rcq    *cq
	cap    verbs.QPCap
	sigAll bool
	qpn    uint32
	srq    *srq // the shared receive queue it takes receives from, or nil

	state     atomic.Uint32         // the last state known (Modify, State); the NIC may have moved on to ERR
	errored   atomic.Bool           // the NIC moved the QP to ERR (an error completion or event)
	fault     atomic.Pointer[error] // why, from an asynchronous event (Fault)
	destroyed atomic.Bool

	mu  sync.Mutex // Modify, State, Destroy
	psn uint32     // our first PSN; mu

	// Send side: flat requests and SGEs in C memory, guarded by smu.
	smu    sync.Mutex
	sq     *C.struct_mwibv_sq
	sin    []C.struct_mwibv_swr
	ssge   []C.struct_ibv_sge
	sPerWR int

	// Receive side, guarded by rmu.
	rmu    sync.Mutex
	rq     *C.struct_mwibv_rq
	rwr    []C.struct_ibv_recv_wr
	rsge   []C.struct_ibv_sge
	rPerWR int
}

func newPSN() uint32 { return rand.Uint32() & 0xffffff }

// CreateQP creates a queue pair in RESET (ibv_create_qp). Cap() reports the capacities the
// device granted, which may exceed those asked for.
func (p *pd) CreateQP(a verbs.QPInitAttr) (verbs.QP, error) {
	ctype, scq, rcq, s, err := p.checkQPAttr(&a)
	if err != nil {
		return nil, err
	}
	if err := p.useForQP(scq, rcq, s); err != nil {
		return nil, err
	}
	d := p.dev
	c := a.Cap
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq = scq.c
	ia.recv_cq = rcq.c
	ia.qp_type = ctype
	if a.SigAll {
		ia.sq_sig_all = 1
	}
	ia.cap.max_send_wr = C.uint32_t(c.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(c.MaxSendSGE)
	ia.cap.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(c.MaxInlineData)
	if s != nil {
		ia.srq = s.c
	}
	cq, err := C.ibv_create_qp(p.c, &ia)
	if cq == nil {
		p.unuseForQP(scq, rcq, s)
		return nil, errnoErr(fmt.Sprintf("%s: create %v QP %+v", d.name, a.Type, c), cErr(err))
	}
	q := &qp{dev: d, pd: p, c: cq, typ: a.Type, scq: scq, rcq: rcq, sigAll: a.SigAll, qpn: uint32(cq.qp_num), psn: newPSN(), srq: s}
	q.cap = grantedCap(cq, ia.cap, s != nil)
	if err := q.alloc(); err != nil {
		C.ibv_destroy_qp(cq)
		p.unuseForQP(scq, rcq, s)
		return nil, err
	}
	d.mu.Lock()
	d.qps[q.qpn] = q
	d.mu.Unlock()
	return q, nil
}

// checkQPAttr checks a QP's attributes against p (its type, CQs and SRQ of this device
// and PD, capacities within the device's) and returns the C type, its CQs and SRQ. It
// fills in the default type, and with an SRQ zeroes the receive capacities, as
// libibverbs ignores them.
func (p *pd) checkQPAttr(a *verbs.QPInitAttr) (ctype C.enum_ibv_qp_type, scq, rcq *cq, s *srq, err error) {
	if a.Type == 0 {
		a.Type = verbs.QPTypeRC
	}
	switch a.Type {
	case verbs.QPTypeRC:
		ctype = C.IBV_QPT_RC
	case verbs.QPTypeUD:
		ctype = C.IBV_QPT_UD
	default:
		return 0, nil, nil, nil, fmt.Errorf("ibv: create QP of type %v: %w", a.Type, verbs.ErrUnsupported)
	}
	d := p.dev
	scq, ok1 := a.SendCQ.(*cq)
	rcq, ok2 := a.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.dev != d || rcq.dev != d {
		return 0, nil, nil, nil, fmt.Errorf("ibv: create QP: send and receive CQs must be CQs of device %s: %w", d.name, verbs.ErrInvalid)
	}
	if a.SRQ != nil {
		var ok bool
		if s, ok = a.SRQ.(*srq); !ok || s == nil || s.pd.protection() != p.protection() {
			return 0, nil, nil, nil, fmt.Errorf("ibv: create QP: the SRQ must be an SRQ of this PD: %w", verbs.ErrInvalid)
		}
		// libibverbs ignores the receive capacities then; they are reported as 0.
		a.Cap.MaxRecvWR, a.Cap.MaxRecvSGE = 0, 0
	}
	c := a.Cap
	lim := d.attr
	switch {
	case c.MaxSendWR < 0 || c.MaxSendWR > lim.MaxQPWR || c.MaxRecvWR < 0 || c.MaxRecvWR > lim.MaxQPWR:
		return 0, nil, nil, nil, fmt.Errorf("ibv: create QP: queue depths %d/%d outside 0..%d: %w", c.MaxSendWR, c.MaxRecvWR, lim.MaxQPWR, verbs.ErrInvalid)
	case c.MaxSendSGE < 0 || c.MaxSendSGE > lim.MaxSGE || c.MaxRecvSGE < 0 || c.MaxRecvSGE > lim.MaxSGE:
		return 0, nil, nil, nil, fmt.Errorf("ibv: create QP: SGE counts %d/%d outside 0..%d: %w", c.MaxSendSGE, c.MaxRecvSGE, lim.MaxSGE, verbs.ErrInvalid)
	case c.MaxInlineData < 0 || c.MaxInlineData > lim.MaxInlineData:
		return 0, nil, nil, nil, fmt.Errorf("ibv: create QP: max inline data %d outside 0..%d: %w", c.MaxInlineData, lim.MaxInlineData, verbs.ErrInvalid)
	}
	return ctype, scq, rcq, s, nil
}

// useForQP takes, for a new QP, a use of p, of both CQs and of the SRQ (if any), so that
// none is destroyed under it; it takes none when one is gone.
func (p *pd) useForQP(scq, rcq *cq, s *srq) error {
	if err := p.use(); err != nil {
		return err
	}
	if err := scq.use(); err != nil {
		p.unuse()
		return err
	}
	if err := rcq.use(); err != nil {
		scq.unuse()
		p.unuse()
		return err
	}
	if s != nil {
		if err := s.users.Acquire("ibv: create QP: SRQ"); err != nil {
			rcq.unuse()
			scq.unuse()
			p.unuse()
			return err
		}
	}
	return nil
}

// unuseForQP gives back what useForQP took.
func (p *pd) unuseForQP(scq, rcq *cq, s *srq) {
	if s != nil {
		s.users.Release()
	}
	rcq.unuse()
	scq.unuse()
	p.unuse()
}

// grantedCap is what a new QP can hold: ibv_create_qp may report the capacities asked for
// while the queues it made are larger (rxe rounds them up to a power of two, less one);
// ibv_query_qp reports those. A QP on an SRQ has no receive queue of its own.
func grantedCap(c *C.struct_ibv_qp, asked C.struct_ibv_qp_cap, onSRQ bool) verbs.QPCap {
	got := asked
	var qa C.struct_ibv_qp_attr
	var qi C.struct_ibv_qp_init_attr
	if C.ibv_query_qp(c, &qa, C.IBV_QP_CAP, &qi) == 0 {
		got.max_send_wr = max(got.max_send_wr, qa.cap.max_send_wr)
		got.max_recv_wr = max(got.max_recv_wr, qa.cap.max_recv_wr)
		got.max_send_sge = max(got.max_send_sge, qa.cap.max_send_sge)
		got.max_recv_sge = max(got.max_recv_sge, qa.cap.max_recv_sge)
		got.max_inline_data = max(got.max_inline_data, qa.cap.max_inline_data)
	}
	if onSRQ {
		got.max_recv_wr, got.max_recv_sge = 0, 0
	}
	return verbs.QPCap{
		MaxSendWR: int(got.max_send_wr), MaxRecvWR: int(got.max_recv_wr),
		MaxSendSGE: int(got.max_send_sge), MaxRecvSGE: int(got.max_recv_sge),
		MaxInlineData: int(got.max_inline_data),
	}
}

// alloc allocates the C memory PostSend and PostRecv fill: one batch of requests per side.
func (q *qp) alloc() error {
	sn := min(max(q.cap.MaxSendWR, 1), maxBatch)
	rn := min(max(q.cap.MaxRecvWR, 1), maxBatch)
	q.sPerWR, q.rPerWR = max(q.cap.MaxSendSGE, 1), max(q.cap.MaxRecvSGE, 1)
	q.sq = C.mwibv_sq_alloc(q.c, C.int(sn), C.int(q.cap.MaxSendSGE))
	if q.srq == nil { // an SRQ's QP posts no receives of its own
		q.rq = C.mwibv_rq_alloc(q.c, C.int(rn), C.int(q.cap.MaxRecvSGE))
	}
	if q.sq == nil || (q.rq == nil && q.srq == nil) {
		q.free()
		return fmt.Errorf("ibv: create QP: allocate %d+%d work request slots: %w", sn, rn, verbs.ErrNoMemory)
	}
	q.sin = unsafe.Slice(q.sq.in, sn)
	q.ssge = unsafe.Slice(q.sq.sge, sn*q.sPerWR)
	if q.rq != nil {
		q.rwr = unsafe.Slice(q.rq.wr, rn)
		q.rsge = unsafe.Slice(q.rq.sge, rn*q.rPerWR)
	}
	return nil
}

func (q *qp) free() {
	C.mwibv_sq_free(q.sq)
	C.mwibv_rq_free(q.rq)
	q.sq, q.rq = nil, nil
	q.sin, q.ssge, q.rwr, q.rsge = nil, nil, nil, nil
}

// Num returns the QP number.
func (q *qp) Num() uint32 { return q.qpn }

// Type returns the QP's transport type.
func (q *qp) Type() verbs.QPType { return q.typ }

// Cap returns the capacities the device granted.
func (q *qp) Cap() verbs.QPCap { return q.cap }

// PD returns the QP's protection domain.
func (q *qp) PD() verbs.PD { return q.pd }

// Endpoint returns the QP number, first PSN, LID and GID the peer connects to.
func (q *qp) Endpoint() verbs.Endpoint {
	q.mu.Lock()
	defer q.mu.Unlock()
	return verbs.Endpoint{QPN: q.qpn, PSN: q.psn, LID: q.dev.lid, GID: q.dev.gid}
}

// State queries the QP's current state (ibv_query_qp): the NIC moves a QP to ERR on its
// own.
func (q *qp) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queryState()
}

// queryState asks the NIC; q.mu or q.smu is held, so that the QP is not destroyed meanwhile.
func (q *qp) queryState() verbs.QPState {
	if q.destroyed.Load() {
		return verbs.QPState(q.state.Load())
	}
	var attr C.struct_ibv_qp_attr
	var init C.struct_ibv_qp_init_attr
	if rc := C.ibv_query_qp(q.c, &attr, C.IBV_QP_STATE, &init); rc != 0 {
		return verbs.QPState(q.state.Load())
	}
	s := verbs.QPState(attr.qp_state)
	q.state.Store(uint32(s))
	if s == verbs.QPStateError {
		q.errored.Store(true)
	}
	return s
}

// Modify moves the QP to a.State with ibv_modify_qp. Only the libibverbs transitions are
// allowed: RESET->INIT->RTR->RTS, INIT->INIT, RTS->RTS, any->ERR, any->RESET. Durations
// become the IBTA's codes (see timeoutCode and rnrTimerCode); a path MTU above the port's
// active MTU is lowered to it. RTS->RTS changes no attribute.
func (q *qp) Modify(a verbs.QPAttr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed.Load() {
		return fmt.Errorf("ibv: modify QP %d: %w", q.qpn, verbs.ErrClosed)
	}
	from, to := q.queryState(), a.State
	var attr C.struct_ibv_qp_attr
	attr.qp_state = C.enum_ibv_qp_state(to)
	mask := C.int(C.IBV_QP_STATE)
	psn := q.psn
	var err error
	switch {
	case to == verbs.QPStateReset:
		psn = newPSN()
	case to == verbs.QPStateError:
	case (from == verbs.QPStateReset || from == verbs.QPStateInit) && to == verbs.QPStateInit:
		err = q.toInit(a, &attr, &mask)
	case from == verbs.QPStateInit && to == verbs.QPStateRTR:
		err = q.toRTR(a, &attr, &mask)
	case from == verbs.QPStateRTR && to == verbs.QPStateRTS:
		attr.sq_psn = C.uint32_t(psn)
		mask |= C.IBV_QP_SQ_PSN
		err = q.toRTS(a, &attr, &mask)
	case from == verbs.QPStateRTS && to == verbs.QPStateRTS:
	default:
		err = fmt.Errorf("ibv: modify QP %d from %v to %v: transition not allowed: %w", q.qpn, from, to, verbs.ErrInvalid)
	}
	if err != nil {
		return err
	}
	if rc := C.ibv_modify_qp(q.c, &attr, mask); rc != 0 {
		return errnoErr(fmt.Sprintf("modify QP %d from %v to %v", q.qpn, from, to), syscall.Errno(rc))
	}
	q.psn = psn
	q.state.Store(uint32(to))
	switch to {
	case verbs.QPStateReset:
		q.errored.Store(false)
	case verbs.QPStateError:
		q.errored.Store(true)
	}
	return nil
}

// toInit fills in the attributes of a move to INIT: the port, and the QKey (UD) or the
// remote access rights (RC).
func (q *qp) toInit(a verbs.QPAttr, attr *C.struct_ibv_qp_attr, mask *C.int) error {
	p := a.Port
	if p == 0 {
		p = port
	}
	if p != port {
		return fmt.Errorf("ibv: modify QP %d to INIT: port %d (the provider uses port 1): %w", q.qpn, p, verbs.ErrUnsupported)
	}
	attr.pkey_index = 0
	attr.port_num = C.uint8_t(p)
	*mask |= C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT
	if q.typ == verbs.QPTypeUD {
		attr.qkey = udQKey
		*mask |= C.IBV_QP_QKEY
		return nil
	}
	if a.Access&^(verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 {
		return fmt.Errorf("ibv: modify QP %d to INIT: access %v (only REMOTE_* rights apply to a QP): %w", q.qpn, a.Access, verbs.ErrInvalid)
	}
	attr.qp_access_flags = C.uint(a.Access)
	*mask |= C.IBV_QP_ACCESS_FLAGS
	return nil
}

// toRTR fills in the attributes of an RC QP's move to RTR: the path to the remote QP, its
// number and PSN, the MTU and the READs it may have outstanding here.
func (q *qp) toRTR(a verbs.QPAttr, attr *C.struct_ibv_qp_attr, mask *C.int) error {
	if q.typ == verbs.QPTypeUD {
		return nil
	}
	lim := q.dev.attr
	mtu, err := mtuEnum(a.PathMTU, q.dev.activeMTU)
	if err != nil {
		return fmt.Errorf("ibv: modify QP %d to RTR: %w", q.qpn, err)
	}
	if a.MaxDestRdAtomic < 0 || a.MaxDestRdAtomic > lim.MaxQPRdAtom {
		return fmt.Errorf("ibv: modify QP %d to RTR: max_dest_rd_atomic %d outside 0..%d: %w", q.qpn, a.MaxDestRdAtomic, lim.MaxQPRdAtom, verbs.ErrInvalid)
	}
	attr.path_mtu = mtu
	attr.dest_qp_num = C.uint32_t(a.Remote.QPN)
	attr.rq_psn = C.uint32_t(a.Remote.PSN & 0xffffff)
	attr.max_dest_rd_atomic = C.uint8_t(a.MaxDestRdAtomic)
	attr.min_rnr_timer = C.uint8_t(rnrTimerCode(a.MinRNRTimer))
	ah := &attr.ah_attr
	ah.dlid = C.uint16_t(a.Remote.LID)
	ah.port_num = port
	if q.dev.ethernet || a.Remote.LID == 0 {
		ah.is_global = 1
		*(*[16]byte)(unsafe.Pointer(&ah.grh.dgid)) = a.Remote.GID
		ah.grh.sgid_index = C.uint8_t(q.dev.gidIndex)
		ah.grh.hop_limit = 64
	}
	*mask |= C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_DEST_QPN | C.IBV_QP_RQ_PSN |
		C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_MIN_RNR_TIMER
	return nil
}

// toRTS fills in the attributes of an RC QP's move to RTS (the send PSN is set by
// Modify): READs outstanding, the ACK timeout and the retry counts.
func (q *qp) toRTS(a verbs.QPAttr, attr *C.struct_ibv_qp_attr, mask *C.int) error {
	if q.typ == verbs.QPTypeUD {
		return nil
	}
	lim := q.dev.attr
	if a.MaxRdAtomic < 0 || a.MaxRdAtomic > lim.MaxQPInitRdAtom || a.RNRRetry < 0 || a.RNRRetry > 7 || a.RetryCnt < 0 || a.RetryCnt > 7 {
		return fmt.Errorf("ibv: modify QP %d to RTS: max_rd_atomic %d (0..%d), rnr_retry %d (0..7), retry_cnt %d (0..7): %w",
			q.qpn, a.MaxRdAtomic, lim.MaxQPInitRdAtom, a.RNRRetry, a.RetryCnt, verbs.ErrInvalid)
	}
	attr.max_rd_atomic = C.uint8_t(max(a.MaxRdAtomic, 1))
	attr.timeout = C.uint8_t(timeoutCode(a.Timeout))
	attr.retry_cnt = C.uint8_t(a.RetryCnt)
	attr.rnr_retry = C.uint8_t(a.RNRRetry)
	*mask |= C.IBV_QP_TIMEOUT | C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY | C.IBV_QP_MAX_QP_RD_ATOMIC
	return nil
}

// mtuEnum converts a path MTU in bytes (0: 1024) to ibv_mtu, lowered to the port's.
func mtuEnum(bytes, active int) (C.enum_ibv_mtu, error) {
	if bytes == 0 {
		bytes = defaultPathMTU
	}
	e := 0
	for i := 1; i <= 5; i++ {
		if 128<<i == bytes {
			e = i
		}
	}
	if e == 0 {
		return 0, fmt.Errorf("path MTU %d (256, 512, 1024, 2048 or 4096): %w", bytes, verbs.ErrInvalid)
	}
	for e > 1 && 128<<e > active {
		e--
	}
	return C.enum_ibv_mtu(e), nil
}

// timeoutCode converts the local ACK timeout to the IBTA's code: the smallest c in 1..31
// with 4.096 us * 2^c >= d (0, the default, is about 1 s).
func timeoutCode(d time.Duration) int {
	if d <= 0 {
		d = defaultTimeout
	}
	for c := 1; c < 31; c++ {
		if 4096*time.Nanosecond<<c >= d {
			return c
		}
	}
	return 31
}

// rnrTimers are the IBTA's minimum RNR NAK timer values of codes 1..31, in units of 10 us;
// code 0 means 655.36 ms.
var rnrTimers = [32]int{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
	1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152}

// rnrTimerCode converts the minimum RNR timer to the IBTA's code: the smallest timer that
// is at least d (0, the default, is 10 us).
func rnrTimerCode(d time.Duration) int {
	if d <= 0 {
		d = defaultRNRTimer
	}
	for c := 1; c < len(rnrTimers); c++ {
		if time.Duration(rnrTimers[c])*10*time.Microsecond >= d {
			return c
		}
	}
	return 0
}

// sendState checks that the QP takes send work requests: RTS, or ERR (where they flush).
// smu is held.
func (q *qp) sendState() error {
	s := verbs.QPState(q.state.Load())
	switch s {
	case verbs.QPStateRTS, verbs.QPStateError, verbs.QPStateSQE:
		return nil
	case verbs.QPStateRTR:
		// The NIC may have moved the QP to ERR since. (smu is held, so the QP is not
		// destroyed under the query.)
		s = q.queryState()
		if s == verbs.QPStateError {
			return nil
		}
	}
	return fmt.Errorf("ibv: QP %d is in state %v; post_send needs RTS (or ERR, which flushes): %w", q.qpn, s, verbs.ErrInvalid)
}

const knownSendFlags = verbs.SendFence | verbs.SendSignaled | verbs.SendSolicited | verbs.SendInline

// PostSend posts send work requests, up to maxBatch per ibv_post_send. When request i is
// refused (by the checks libibverbs providers make at post time, or by the provider), the
// ones before it are posted.
func (q *qp) PostSend(wrs []verbs.SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.destroyed.Load() {
		return &verbs.PostError{Op: "post_send", Index: 0, Err: fmt.Errorf("ibv: QP %d: %w", q.qpn, verbs.ErrClosed)}
	}
	if err := q.sendState(); err != nil {
		return &verbs.PostError{Op: "post_send", Index: 0, Err: err}
	}
	done := 0
	for done < len(wrs) {
		n := 0
		var perr error
		for n < len(q.sin) && done+n < len(wrs) {
			if perr = q.fillSend(n, &wrs[done+n]); perr != nil {
				break
			}
			n++
		}
		if n > 0 {
			if rc := C.mwibv_post_send(q.sq, C.int(n)); rc != 0 {
				return &verbs.PostError{Op: "post_send", Index: done + int(q.sq.bad), Err: postErr(q.qpn, "post_send", syscall.Errno(rc))}
			}
		}
		if perr != nil {
			return &verbs.PostError{Op: "post_send", Index: done + n, Err: perr}
		}
		done += n
	}
	return nil
}

func postErr(qpn uint32, op string, e syscall.Errno) error {
	if e == syscall.ENOMEM {
		return fmt.Errorf("ibv: QP %d: %s: work queue full: %w: %w", qpn, op, verbs.ErrQueueFull, e)
	}
	return errnoErr(fmt.Sprintf("QP %d: %s", qpn, op), e)
}

// fillSend checks wr and stores it as request i of the batch. smu is held.
func (q *qp) fillSend(i int, wr *verbs.SendWR) error {
	in := &q.sin[i]
	op := wr.Opcode
	in.wr_id = C.uint64_t(wr.WRID)
	in.opcode = C.uint32_t(op)
	in.send_flags = C.uint32_t(wr.Flags & knownSendFlags)
	in.imm, in.inv_rkey, in.rkey, in.remote_addr, in.length, in.access, in.num_sge = 0, 0, 0, 0, 0, 0, 0
	in.mw, in.mr = nil, nil
	if op == verbs.WRBindMW {
		return q.fillBind(in, wr)
	}
	if q.typ != verbs.QPTypeRC {
		return fmt.Errorf("ibv: %v on a %v QP: %w", op, q.typ, verbs.ErrUnsupported)
	}
	switch op {
	case verbs.WRSend, verbs.WRRDMAWrite, verbs.WRRDMARead:
	case verbs.WRSendWithImm, verbs.WRRDMAWriteWithImm:
		in.imm = C.uint32_t(wr.ImmData)
	case verbs.WRSendWithInv:
		in.inv_rkey = C.uint32_t(wr.InvalidateRKey)
	case verbs.WRLocalInv:
		if len(wr.SGL) > 0 {
			return fmt.Errorf("ibv: LOCAL_INV with %d SGEs (needs none): %w", len(wr.SGL), verbs.ErrInvalid)
		}
		in.inv_rkey = C.uint32_t(wr.InvalidateRKey)
		return nil
	default:
		return fmt.Errorf("ibv: unknown opcode %v: %w", op, verbs.ErrInvalid)
	}
	if op == verbs.WRRDMAWrite || op == verbs.WRRDMAWriteWithImm || op == verbs.WRRDMARead {
		in.remote_addr = C.uint64_t(wr.RemoteAddr)
		in.rkey = C.uint32_t(wr.RKey)
	}
	if len(wr.SGL) > q.cap.MaxSendSGE {
		return fmt.Errorf("ibv: %v with %d SGEs (max_send_sge %d): %w", op, len(wr.SGL), q.cap.MaxSendSGE, verbs.ErrInvalid)
	}
	if wr.Flags&verbs.SendInline != 0 {
		if op == verbs.WRRDMARead {
			return fmt.Errorf("ibv: inline RDMA_READ: %w", verbs.ErrInvalid)
		}
		var total uint64
		for _, s := range wr.SGL {
			total += uint64(s.Length)
		}
		if total > uint64(q.cap.MaxInlineData) {
			return fmt.Errorf("ibv: inline %v of %d bytes exceeds max_inline_data %d: %w", op, total, q.cap.MaxInlineData, verbs.ErrInvalid)
		}
	}
	sg := q.ssge[i*q.sPerWR:]
	for j, s := range wr.SGL {
		sg[j] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
	}
	in.num_sge = C.uint32_t(len(wr.SGL))
	return nil
}

// fillBind checks a BIND_MW and stores it in in: the window and region it names (both of
// this provider, the window allocated, the region registered), the range, key and access.
// A type-2 window bound under its allocation's key index records the QP it is bound to.
func (q *qp) fillBind(in *C.struct_mwibv_swr, wr *verbs.SendWR) error {
	b := &wr.Bind
	switch {
	case q.typ != verbs.QPTypeRC:
		return fmt.Errorf("ibv: BIND_MW on a %v QP (needs RC): %w", q.typ, verbs.ErrInvalid)
	case len(wr.SGL) > 0:
		return fmt.Errorf("ibv: BIND_MW with %d SGEs (needs none): %w", len(wr.SGL), verbs.ErrInvalid)
	case wr.ImmData != 0:
		return fmt.Errorf("ibv: BIND_MW with immediate data: %w", verbs.ErrInvalid)
	case b.MW == nil:
		return fmt.Errorf("ibv: BIND_MW without a window: %w", verbs.ErrInvalid)
	case b.MW.Type() == verbs.MWType1 && b.Access&verbs.AccessZeroBased != 0:
		return fmt.Errorf("ibv: zero-based bind of a type-1 window: %w", verbs.ErrInvalid)
	}
	w, ok := b.MW.(*mw)
	if !ok || w == nil {
		return fmt.Errorf("ibv: BIND_MW of a window of another provider: %w", verbs.ErrInvalid)
	}
	m, ok := b.MR.(*mr)
	if !ok || m == nil {
		return fmt.Errorf("ibv: BIND_MW over a region of another provider: %w", verbs.ErrInvalid)
	}
	mc := m.cptr()
	if mc == nil {
		return fmt.Errorf("ibv: BIND_MW over a deregistered region: %w", verbs.ErrInvalid)
	}
	w.mu.Lock()
	wc := w.c
	if wc != nil && w.typ == verbs.MWType2 && verbs.KeyIndex(b.RKey) == verbs.KeyIndex(w.allocKey) {
		w.boundQP = q
	}
	w.mu.Unlock()
	if wc == nil {
		return fmt.Errorf("ibv: BIND_MW of a deallocated window: %w", verbs.ErrInvalid)
	}
	in.mw, in.mr = wc, mc
	in.remote_addr = C.uint64_t(b.Addr)
	in.length = C.uint64_t(b.Length)
	in.rkey = C.uint32_t(b.RKey)
	in.access = C.uint32_t(b.Access)
	return nil
}

// fillRecvs copies receive work requests from the front of wrs into a batch in C memory
// (rwr, each with perWR of the SGEs in rsge), as many as the batch holds, and returns how
// many. It stops before a request with more than maxSGE SGEs (tooMany).
func fillRecvs(rwr []C.struct_ibv_recv_wr, rsge []C.struct_ibv_sge, perWR, maxSGE int, wrs []verbs.RecvWR) (n int, tooMany bool) {
	for ; n < len(rwr) && n < len(wrs); n++ {
		wr := &wrs[n]
		if len(wr.SGL) > maxSGE {
			return n, true
		}
		sg := rsge[n*perWR:]
		for j, s := range wr.SGL {
			sg[j] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
		}
		rwr[n].wr_id = C.uint64_t(wr.WRID)
		rwr[n].num_sge = C.int(len(wr.SGL))
	}
	return n, false
}

// PostRecv posts receive work requests, up to maxBatch per ibv_post_recv.
func (q *qp) PostRecv(wrs []verbs.RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.destroyed.Load() {
		return &verbs.PostError{Op: "post_recv", Index: 0, Err: fmt.Errorf("ibv: QP %d: %w", q.qpn, verbs.ErrClosed)}
	}
	if q.srq != nil {
		return &verbs.PostError{Op: "post_recv", Index: 0,
			Err: fmt.Errorf("ibv: QP %d takes its receives from an SRQ; post them there: %w", q.qpn, verbs.ErrInvalid)}
	}
	if s := verbs.QPState(q.state.Load()); s == verbs.QPStateReset {
		return &verbs.PostError{Op: "post_recv", Index: 0,
			Err: fmt.Errorf("ibv: QP %d is in state RESET; post_recv needs INIT or later: %w", q.qpn, verbs.ErrInvalid)}
	}
	done := 0
	var err error
	for done < len(wrs) && err == nil {
		n, tooMany := fillRecvs(q.rwr, q.rsge, q.rPerWR, q.cap.MaxRecvSGE, wrs[done:])
		if tooMany {
			err = &verbs.PostError{Op: "post_recv", Index: done + n,
				Err: fmt.Errorf("ibv: receive with %d SGEs (max_recv_sge %d): %w", len(wrs[done+n].SGL), q.cap.MaxRecvSGE, verbs.ErrInvalid)}
		}
		if n > 0 {
			if rc := C.mwibv_post_recv(q.rq, C.int(n)); rc != 0 {
				err = &verbs.PostError{Op: "post_recv", Index: done + int(q.rq.bad), Err: postErr(q.qpn, "post_recv", syscall.Errno(rc))}
			}
		}
		done += n
	}
	// rxe's user-space post_recv only writes the queue it shares with the kernel, and the
	// kernel flushes receives posted to a QP in ERR only when its responder runs (which
	// rxe's own post_recv schedules, but rxe does not offer that command to user space).
	// Moving the QP to ERR again runs it (rxe_qp_error), so the receives flush as the
	// IBTA says.
	if q.dev.rxe && done > 0 && (q.errored.Load() || verbs.QPState(q.state.Load()) == verbs.QPStateError) {
		var attr C.struct_ibv_qp_attr
		attr.qp_state = C.IBV_QPS_ERR
		C.ibv_modify_qp(q.c, &attr, C.IBV_QP_STATE)
	}
	return err
}

// bindType1 binds a type-1 window through q with ibv_bind_mw and returns its new rkey.
func (q *qp) bindType1(w *mw, m *mr, wrid uint64, flags verbs.SendFlags, b verbs.MWBind) (uint32, error) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.destroyed.Load() {
		return 0, fmt.Errorf("ibv: MW.Bind through QP %d: %w", q.qpn, verbs.ErrClosed)
	}
	if q.typ != verbs.QPTypeRC {
		return 0, fmt.Errorf("ibv: MW.Bind through a %v QP (needs RC): %w", q.typ, verbs.ErrInvalid)
	}
	if err := q.sendState(); err != nil {
		return 0, err
	}
	mc := m.cptr()
	if mc == nil {
		return 0, fmt.Errorf("ibv: MW.Bind over a deregistered region: %w", verbs.ErrInvalid)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.c == nil {
		return 0, fmt.Errorf("ibv: MW.Bind of a deallocated window: %w", verbs.ErrClosed)
	}
	rc := C.mwibv_bind_type1(q.c, w.c, mc, C.uint64_t(wrid), C.uint32_t(flags&knownSendFlags),
		C.uint64_t(b.Addr), C.uint64_t(b.Length), C.uint32_t(b.Access))
	if rc != 0 {
		return 0, postErr(q.qpn, "bind_mw", syscall.Errno(rc))
	}
	return uint32(w.c.rkey), nil
}

// Destroy releases the QP (ibv_destroy_qp). Type-2 windows bound to it are released first
// (see mw.release): their RKey() is a new allocation key afterwards.
func (q *qp) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed.Load() {
		return fmt.Errorf("ibv: destroy QP %d: %w", q.qpn, verbs.ErrClosed)
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	q.rmu.Lock()
	defer q.rmu.Unlock()
	d := q.dev
	d.mu.Lock()
	var ws []*mw
	for _, w := range d.mws {
		if w.typ == verbs.MWType2 {
			ws = append(ws, w)
		}
	}
	d.mu.Unlock()
	var relErr error
	for _, w := range ws {
		w.mu.Lock()
		if w.boundQP == q && w.c != nil {
			gone, err := w.release()
			if !gone {
				w.mu.Unlock()
				return fmt.Errorf("ibv: destroy QP %d: a window bound to it could not be released: %w", q.qpn, err)
			}
			if err != nil && relErr == nil {
				relErr = err
			}
		}
		w.mu.Unlock()
	}
	if rc := C.ibv_destroy_qp(q.c); rc != 0 {
		return errnoErr(fmt.Sprintf("destroy QP %d", q.qpn), syscall.Errno(rc))
	}
	q.destroyed.Store(true)
	q.free()
	d.mu.Lock()
	delete(d.qps, q.qpn)
	d.mu.Unlock()
	if q.srq != nil {
		q.srq.users.Release()
	}
	q.scq.unuse()
	q.rcq.unuse()
	q.pd.unuse()
	return relErr
}

// Fault returns why the QP moved to ERR on its own, from its affiliated asynchronous event
// (IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_QP_REQ_ERR), or nil. The event may come a moment
// after the completions it flushed.
func (q *qp) Fault() error {
	if p := q.fault.Load(); p != nil {
		return *p
	}
	return nil
}

var _ verbs.FaultReporter = (*qp)(nil)
