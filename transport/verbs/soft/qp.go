package soft

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mwrpc/mwrpc/internal/clock"
	"github.com/mwrpc/mwrpc/internal/idle"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Defaults for attributes left zero.
const (
	defaultTimeout  = time.Second // local ACK timeout, per retry
	defaultRNRTimer = 10 * time.Microsecond
	infiniteRNR     = 7
)

var (
	errLinkDown = errors.New("soft: link down")
	errNotReady = errors.New("soft: peer QP not ready to receive")
)

// QP is a reliable-connected queue pair of a soft device. It implements verbs.QP and
// verbs.StreamQP.
//
// Each connected QP runs one engine goroutine, which transmits (requests from the send
// queue, and the responder's ACKs, NAKs and READ responses) and never runs application
// code; on the TCP fabric a second goroutine reads the stream. Incoming frames are handled
// one at a time in order (rxMu), like a NIC's receive pipeline: the responder checks them,
// places their payload straight into registered memory and queues completions; the
// requester matches ACKs, NAKs and READ responses to its outstanding work requests.
type QP struct {
	dev     *Device
	pd      *pd
	domain  *parentDomain // created on it (its count), or nil
	td      *td           // the parent domain's thread domain: posts are checked against it
	db      doorbell      // mu; from the parent domain's allocator, if it has one
	typ     verbs.QPType
	scq     *cq
	rcq     *cq
	cap     verbs.QPCap
	sigAll  bool
	qpn     uint32
	st      *stats // the device's counters this QP adds to (its stripe)
	stripe  uint32 // qpn % statStripes: its stripe of those, and of the key lock and regions' transfer counts
	initPSN uint32

	rxMu     sync.Mutex  // serializes incoming frames
	rxClosed bool        // rxMu: the link was shut down; deliveries are refused
	txMu     sync.Mutex  // held by whoever transmits: the engine, or a poster doing it inline
	txAgain  atomic.Bool // a poster found txMu held: its holder transmits once more (takeTx)
	// placeLarge: SENDs above PlacedSendMax are placed too (PlaceLargeSends).
	placeLarge atomic.Bool
	mu         sync.Mutex // everything below

	state     verbs.QPState
	destroyed bool
	fault     error // why the QP moved to ERR on its own (verbs.FaultReporter)
	peerLeft  bool  // it moved to ERR because its peer went away (verbs.PeerLeftReporter)
	// stallLimit is how long a frame, once begun on the stream, may stop arriving before
	// the link is dropped: the local ACK timeout times the retries, the budget a requester
	// gives an unanswered packet (TCP fabric).
	stallLimit atomic.Int64
	access     verbs.Access
	remote     verbs.Endpoint
	maxDestRd  int
	maxRd      int
	rnrTimer   time.Duration // ours, announced in RNR NAKs
	timeout    time.Duration
	retryCnt   int
	rnrRetry   int

	stream net.Conn // attached, not yet started (TCP fabric)
	link   link
	wake   chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup

	// Send queue: [sqHead, sqNext) transmitted or executed, [sqNext, sqTail) waiting.
	// sq is a ring of work requests, indexed by absolute position modulo its length. It
	// starts at sqInitial and doubles when full, up to cap.MaxSendWR: a QP that never has
	// many outstanding (an idle connection's) holds few. Its elements are pointers so that
	// a work request being executed outside q.mu (a READ response being placed) stays put
	// when the ring grows.
	sq      []*swqe
	sqHead  uint64
	sqNext  uint64
	sqTail  uint64
	nextPSN uint32
	rdOut   int  // READs transmitted and not answered
	halted  bool // a work request failed: transmit nothing more until it completes in order
	rnrWait bool
	// txPreferSQ: a READ response segment just left, so the send queue goes first next.
	txPreferSQ bool
	rnrT       *time.Timer
	ackT       *time.Timer
	ackOn      bool

	// Receive queue, or the shared one the QP takes its receives from (then rq is empty).
	srq    *srq
	rxWQE  rwqe // the receive last taken from srq; owned by the holder of rxMu
	rq     []rwqe
	rqHead uint64
	rqTail uint64
	ePSN   uint32
	// rxTaken: the responder took a receive (its completion is rxWC) and is placing the
	// payload without q.mu; a move to ERR meanwhile flushes it before the queue's others.
	rxTaken bool
	rxWC    verbs.WorkCompletion
	// onError runs once when the QP moves to ERR (verbs.ErrorNotifier).
	onError func()

	// Responder output, sent by the engine before any request: one coalesced ACK, then
	// READ responses and NAKs in order.
	ackPending bool
	ackDue     bool // the delay is over: send the ACK even alone
	ackPSN     uint32
	ackSince   int64 // lastRx when the oldest message the pending ACK covers came
	ackCount   int   // messages the pending ACK covers
	ackSeen    bool  // a message was acknowledged since the delayed-ACK timer last fired
	ackTimerOn bool
	ackDelayT  *time.Timer
	outq       []outFrame
	outHead    int

	lastRx atomic.Int64 // clock.Nanos of the last frame received, for the ACK timeout

	// Scratch, owned by the holder of txMu (tx*) and by the holder of rxMu (rx*).
	txHdr       header
	txSegs      [][]byte
	txMRs       []*mr
	txPlace     []byte // a placed READ's payload
	rxSegs      [][]byte
	rxMRs       []*mr
	rxPlace     [placementLen]byte                     // a placed READ's or WRITE's placement, read by the responder
	rxPlaceSend [MaxSendPlacements * placementLen]byte // a placed SEND's placements, read by the receiver
}

type swqe struct {
	wr      verbs.SendWR // SGL is nil: the elements are in sges
	sges    []verbs.SGE
	inline  []byte
	psn     uint32
	hasPSN  bool
	sent    bool // transmitted (remote operations) or executed (local ones)
	done    bool
	status  verbs.WCStatus
	byteLen uint32
	rnrLeft int
	rdGot   uint32 // READ: response bytes placed so far (segments come in order)
	placed  bool   // READ: its last transmission asked the responder to place it (placed.go)
	// placeLarge: a SEND above PlacedSendMax may be placed (PlaceLargeSends, when posted).
	placeLarge bool
}

type rwqe struct {
	wrid uint64
	sges []verbs.SGE
}

type outFrame struct {
	h    header
	data []byte
	mr   *mr // acquired for data; released once sent
}

func (p *pd) CreateQP(a verbs.QPInitAttr) (verbs.QP, error) {
	scq, rcq, s, err := p.checkQPAttr(&a)
	if err != nil {
		return nil, err
	}
	if err := p.useForQP(scq, rcq, s); err != nil {
		return nil, err
	}
	q := newQP(p, a, scq, rcq, s)
	d := p.dev
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		p.unuseForQP(scq, rcq, s)
		return nil, fmt.Errorf("soft: create QP: device %s: %w", d.name, verbs.ErrClosed)
	}
	q.qpn = d.nextQPN
	q.stripe = q.qpn % statStripes
	q.st = &d.stats[q.stripe]
	d.nextQPN++
	d.qps[q.qpn] = q
	d.mu.Unlock()
	return q, nil
}

// checkQPAttr checks a QP's attributes against p (its type, CQs and SRQ of this device
// and PD, capacities within the provider's) and returns its CQs and SRQ. It fills in the
// default type, and with an SRQ zeroes the receive capacities, as libibverbs ignores them.
func (p *pd) checkQPAttr(a *verbs.QPInitAttr) (scq, rcq *cq, s *srq, err error) {
	if a.Type == 0 {
		a.Type = verbs.QPTypeRC
	}
	if a.Type != verbs.QPTypeRC && a.Type != verbs.QPTypeUD {
		return nil, nil, nil, fmt.Errorf("soft: create QP of type %v: %w", a.Type, verbs.ErrUnsupported)
	}
	scq, ok1 := a.SendCQ.(*cq)
	rcq, ok2 := a.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.dev != p.dev || rcq.dev != p.dev {
		return nil, nil, nil, fmt.Errorf("soft: create QP: send and receive CQs must be CQs of device %s: %w", p.dev.name, verbs.ErrInvalid)
	}
	if a.SRQ != nil {
		var ok bool
		if s, ok = a.SRQ.(*srq); !ok || s == nil || s.pd != p {
			return nil, nil, nil, fmt.Errorf("soft: create QP: the SRQ must be an SRQ of this PD: %w", verbs.ErrInvalid)
		}
		// As in libibverbs, the receive capacities are ignored.
		a.Cap.MaxRecvWR, a.Cap.MaxRecvSGE = 0, 0
	}
	c := a.Cap
	switch {
	case c.MaxSendWR < 0 || c.MaxSendWR > maxQPWR || c.MaxRecvWR < 0 || c.MaxRecvWR > maxQPWR:
		return nil, nil, nil, fmt.Errorf("soft: create QP: queue depths %d/%d outside 0..%d: %w", c.MaxSendWR, c.MaxRecvWR, maxQPWR, verbs.ErrInvalid)
	case c.MaxSendSGE < 0 || c.MaxSendSGE > maxSGE || c.MaxRecvSGE < 0 || c.MaxRecvSGE > maxSGE:
		return nil, nil, nil, fmt.Errorf("soft: create QP: SGE counts %d/%d outside 0..%d: %w", c.MaxSendSGE, c.MaxRecvSGE, maxSGE, verbs.ErrInvalid)
	case c.MaxInlineData < 0 || c.MaxInlineData > maxInlineData:
		return nil, nil, nil, fmt.Errorf("soft: create QP: max inline data %d outside 0..%d: %w", c.MaxInlineData, maxInlineData, verbs.ErrInvalid)
	}
	return scq, rcq, s, nil
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
		if err := s.users.Acquire("soft: create QP: SRQ"); err != nil {
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

// newQP makes a QP of a's type and capacities on p, its queues allocated, in RESET and
// not yet numbered.
func newQP(p *pd, a verbs.QPInitAttr, scq, rcq *cq, s *srq) *QP {
	c := a.Cap
	q := &QP{
		dev: p.dev, pd: p, typ: a.Type, scq: scq, rcq: rcq, cap: c, sigAll: a.SigAll,
		initPSN: rand.Uint32() & psnMask,
		sq:      make([]*swqe, min(c.MaxSendWR, sqInitial)),
		rq:      make([]rwqe, c.MaxRecvWR),
		txSegs:  make([][]byte, 0, maxSGE+1),
		rxSegs:  make([][]byte, 0, maxSGE),
		txMRs:   make([]*mr, 0, maxSGE),
		rxMRs:   make([]*mr, 0, maxSGE),
		wake:    make(chan struct{}, 1),
		srq:     s,
	}
	if s != nil {
		q.rxWQE.sges = make([]verbs.SGE, 0, s.attr.MaxSGE)
	}
	q.nextPSN = q.initPSN
	for i := range q.sq {
		q.sq[i] = &swqe{sges: make([]verbs.SGE, 0, c.MaxSendSGE)}
	}
	for i := range q.rq {
		q.rq[i].sges = make([]verbs.SGE, 0, c.MaxRecvSGE)
	}
	return q
}

// Num returns the QP number.
func (q *QP) Num() uint32 { return q.qpn }

// Type returns the QP's transport type.
func (q *QP) Type() verbs.QPType { return q.typ }

// Cap returns the capacities the QP was created with.
func (q *QP) Cap() verbs.QPCap { return q.cap }

// PD returns the QP's protection domain.
func (q *QP) PD() verbs.PD { return q.pd }

// State returns the QP's current state.
func (q *QP) State() verbs.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// Endpoint returns the QP number, first PSN and device GID the peer connects to.
func (q *QP) Endpoint() verbs.Endpoint {
	return verbs.Endpoint{QPN: q.qpn, PSN: q.initPSN, GID: q.dev.gid}
}

// NeedsStream reports whether the QP is on the TCP fabric and must be given a stream.
func (q *QP) NeedsStream() bool { return q.dev.fabric == nil }

// AttachStream makes conn the QP's wire (TCP fabric). It must be called in RESET or INIT,
// before the move to RTR, which starts reading it. The QP owns conn from then on.
func (q *QP) AttachStream(conn net.Conn) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.destroyed:
		return fmt.Errorf("soft: attach stream to QP %d: %w", q.qpn, verbs.ErrClosed)
	case q.dev.fabric != nil:
		return fmt.Errorf("soft: attach stream to QP %d: its device is on an in-process fabric: %w", q.qpn, verbs.ErrInvalid)
	case q.state != verbs.QPStateReset && q.state != verbs.QPStateInit:
		return fmt.Errorf("soft: attach stream to QP %d in state %v (needs RESET or INIT): %w", q.qpn, q.state, verbs.ErrInvalid)
	case q.stream != nil:
		return fmt.Errorf("soft: attach stream to QP %d: a stream is already attached: %w", q.qpn, verbs.ErrInvalid)
	}
	q.stream = conn
	sock := conn
	if u, ok := conn.(interface{ NetConn() net.Conn }); ok { // TLS: the socket under it
		sock = u.NetConn()
	}
	if tc, ok := sock.(interface{ SetWriteBuffer(int) error }); ok {
		_ = tc.SetWriteBuffer(streamSendBuffer) // best effort: a default buffer only costs speed
	}
	return nil
}

// streamSendBuffer is the send buffer (SO_SNDBUF) of a TCP fabric stream. Left to Linux's
// autotuning, a stream queues megabytes: a small frame waits behind all of it, and the
// reader copies out data long gone from the cache. Measured on loopback (2 cores, A/B
// rounds): 1 MiB calls 1.45x -> 0.86x raw TCP at c1 and 1.41x -> 1.26x at 32 callers; a
// 64 B call beside two 16 MiB callers 2.5 -> 0.67 ms p50; 64 B and 64 KiB calls unchanged.
const streamSendBuffer = 256 << 10

// Modify moves the QP to a.State.
func (q *QP) Modify(a verbs.QPAttr) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return fmt.Errorf("soft: modify QP %d: %w", q.qpn, verbs.ErrClosed)
	}
	from, to := q.state, a.State
	switch {
	case to == verbs.QPStateReset:
		q.reset()
		return nil
	case to == verbs.QPStateError:
		q.toError(0)
		return nil
	case (from == verbs.QPStateReset || from == verbs.QPStateInit) && to == verbs.QPStateInit:
		if a.Access&^(verbs.AccessRemoteRead|verbs.AccessRemoteWrite|verbs.AccessRemoteAtomic) != 0 {
			return fmt.Errorf("soft: modify QP %d to INIT: access %v (only REMOTE_* rights apply to a QP): %w", q.qpn, a.Access, verbs.ErrInvalid)
		}
		q.access = a.Access
	case from == verbs.QPStateInit && to == verbs.QPStateRTR:
		if q.typ != verbs.QPTypeRC {
			return fmt.Errorf("soft: modify %v QP %d to RTR: %w", q.typ, q.qpn, verbs.ErrUnsupported)
		}
		if a.MaxDestRdAtomic < 0 || a.MaxDestRdAtomic > maxRdAtom {
			return fmt.Errorf("soft: modify QP %d to RTR: max_dest_rd_atomic %d outside 0..%d: %w", q.qpn, a.MaxDestRdAtomic, maxRdAtom, verbs.ErrInvalid)
		}
		if err := q.connect(a.Remote); err != nil {
			return err
		}
		q.remote, q.ePSN = a.Remote, a.Remote.PSN&psnMask
		q.maxDestRd = a.MaxDestRdAtomic
		q.rnrTimer = a.MinRNRTimer
		if q.rnrTimer <= 0 {
			q.rnrTimer = defaultRNRTimer
		}
	case from == verbs.QPStateRTR && to == verbs.QPStateRTS, from == verbs.QPStateRTS && to == verbs.QPStateRTS:
		if a.MaxRdAtomic < 0 || a.MaxRdAtomic > maxRdAtom || a.RNRRetry < 0 || a.RNRRetry > infiniteRNR || a.RetryCnt < 0 || a.RetryCnt > 7 {
			return fmt.Errorf("soft: modify QP %d to RTS: max_rd_atomic %d (0..%d), rnr_retry %d (0..7), retry_cnt %d (0..7): %w",
				q.qpn, a.MaxRdAtomic, maxRdAtom, a.RNRRetry, a.RetryCnt, verbs.ErrInvalid)
		}
		q.maxRd = max(a.MaxRdAtomic, 1)
		q.timeout = a.Timeout
		if q.timeout <= 0 {
			q.timeout = defaultTimeout
		}
		q.retryCnt, q.rnrRetry = a.RetryCnt, a.RNRRetry
		q.stallLimit.Store(int64(q.timeout) * int64(q.retryCnt+1))
	default:
		return fmt.Errorf("soft: modify QP %d from %v to %v: transition not allowed: %w", q.qpn, from, to, verbs.ErrInvalid)
	}
	q.state = to
	return nil
}

// connect builds the QP's link at RTR and starts its goroutines. q.mu is held.
func (q *QP) connect(remote verbs.Endpoint) error {
	var l link
	if f := q.dev.fabric; f != nil {
		d := f.lookup(remote.GID)
		if d == nil {
			return fmt.Errorf("soft: modify QP %d to RTR: no device with GID %x on this fabric: %w", q.qpn, remote.GID, verbs.ErrInvalid)
		}
		d.mu.Lock()
		peer := d.qps[remote.QPN]
		d.mu.Unlock()
		if peer == nil {
			return fmt.Errorf("soft: modify QP %d to RTR: device %s has no QP %d: %w", q.qpn, d.name, remote.QPN, verbs.ErrInvalid)
		}
		l = &inprocLink{local: q, peer: peer}
	} else {
		if q.stream == nil {
			return fmt.Errorf("soft: modify QP %d to RTR: no stream attached (TCP fabric QPs need AttachStream, which cm.Connect does): %w", q.qpn, verbs.ErrInvalid)
		}
		tl := &tcpLink{q: q, conn: q.stream}
		if tc, ok := q.stream.(*net.TCPConn); ok && rawWrites {
			tl.raw, _ = tc.SyscallConn()
			if tl.raw != nil {
				tl.src.now = &nowReader{raw: tl.raw} // the reader's: set before it starts
				tl.fr.direct = true
				if b := q.dev.busyPollBudget(); b > 0 {
					tl.fr.poll = &busyPoll{now: nowReader{raw: tl.raw}, spin: idle.NewFitSpinner(b), polled: &q.st.busyPolled}
				}
			}
		} else if tw, ok := q.stream.(TryWriter); ok {
			tl.try = tw
			// A stream with its own non-blocking writes (the shm fabric's ring) is read by
			// a copy, each read costing the ring's checks and a store the writer sees: one
			// read takes every frame queued there, up to readAhead, not about one small one.
			tl.fr.rb = make([]byte, readAhead)
		}
		tl.bw, _ = q.stream.(BuffersWriter)
		tl.tbw, _ = q.stream.(TryBuffersWriter)
		tl.shared, _ = q.stream.(SharedMemoryWire)
		q.stream = nil
		q.stallLimit.CompareAndSwap(0, int64(defaultTimeout)*(7+1)) // until RTS sets its own
		l = tl
		q.wg.Add(1)
		go tl.readLoop()
	}
	q.link = l
	q.stop = make(chan struct{})
	q.lastRx.Store(clock.Nanos())
	q.wg.Add(1)
	go q.engine(l, q.stop)
	return nil
}

// reset returns the QP to RESET: the link closes, queues empty without completions. q.mu
// is held; it is released while the goroutines stop.
func (q *QP) reset() {
	q.state = verbs.QPStateReset
	q.rxTaken = false // a receive being placed is dropped too, without a completion
	q.shutdownLocked()
	for ; q.sqHead < q.sqTail; q.sqHead++ {
		q.clearSlot(q.slot(q.sqHead))
	}
	q.sqNext, q.rqHead = q.sqTail, q.rqTail
	q.halted, q.rnrWait, q.rdOut = false, false, 0
	q.ackSent()
	q.dropOutput()
	q.initPSN = rand.Uint32() & psnMask
	q.nextPSN = q.initPSN
	q.rxMu.Lock()
	q.rxClosed = false
	q.rxMu.Unlock()
}

// shutdownLocked closes the link and waits for the QP's goroutines. q.mu is held on entry
// and exit but released while waiting.
func (q *QP) shutdownLocked() {
	l, stop := q.link, q.stop
	q.link, q.stop = nil, nil
	if q.stream != nil {
		_ = q.stream.Close()
		q.stream = nil
	}
	if q.rnrT != nil {
		q.rnrT.Stop()
	}
	if q.ackT != nil {
		q.ackT.Stop()
		q.ackOn = false
	}
	if q.ackDelayT != nil {
		q.ackDelayT.Stop()
		q.ackTimerOn = false
	}
	if l == nil {
		return
	}
	q.mu.Unlock()
	// The deadline comes before txMu: its holder may be blocked writing to a peer that
	// stopped reading (the engine, or a PostSendWait poster), and only the deadline ends
	// that write.
	l.setDeadline(time.Now().Add(100 * time.Millisecond))
	// What the responder already queued (a NAK above all, and a delayed ACK) leaves before
	// the link closes, as hardware would have sent it at once.
	q.txMu.Lock()
	q.mu.Lock()
	q.link = l
	q.ackDue = true // a delayed ACK is owed now
	q.mu.Unlock()
	l.setDeadline(time.Now().Add(100 * time.Millisecond))
	for q.step(l, 0) == stepMore {
	}
	q.flushTx(l)
	q.mu.Lock()
	q.link = nil
	q.mu.Unlock()
	q.txMu.Unlock()
	l.close()
	close(stop)
	q.wg.Wait()
	q.rxMu.Lock() // wait out a delivery in progress from an in-process peer
	q.rxClosed = true
	q.rxMu.Unlock()
	q.mu.Lock()
}

// Destroy moves the QP to ERR (flushing its work requests), closes its link and releases
// it. A peer on the other end sees the link go down.
func (q *QP) Destroy() error {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return fmt.Errorf("soft: destroy QP %d: %w", q.qpn, verbs.ErrClosed)
	}
	q.toError(0)
	q.destroyed = true
	q.shutdownLocked()
	q.dropOutput()
	db := q.db
	q.db = doorbell{}
	q.mu.Unlock()
	db.free() // outside mu: the allocator is the application's code
	d := q.dev
	d.mu.Lock()
	delete(d.qps, q.qpn)
	d.mu.Unlock()
	if q.srq != nil { // its receives stay for the other QPs
		q.srq.users.Release()
	}
	q.scq.unuse()
	q.rcq.unuse()
	q.pd.unuse()
	q.domain.release()
	return nil
}

func (q *QP) dropOutput() {
	for i := q.outHead; i < len(q.outq); i++ {
		if m := q.outq[i].mr; m != nil {
			m.release(q.stripe)
		}
		q.outq[i] = outFrame{}
	}
	q.outq, q.outHead = q.outq[:0], 0
}

func (q *QP) slot(i uint64) *swqe { return q.sq[i%uint64(len(q.sq))] }

// sqInitial is the send queue ring's first length.
const sqInitial = 16

// growSQ doubles the send queue ring (up to cap.MaxSendWR), keeping every outstanding work
// request at its absolute position and every element's address. q.mu is held.
func (q *QP) growSQ() {
	old := q.sq
	n := min(2*len(old), q.cap.MaxSendWR)
	sq := make([]*swqe, n)
	spare := make([]*swqe, 0, len(old))
	for i := uint64(0); i < uint64(len(old)); i++ { // the free elements, to reuse
		if abs := q.sqHead + i; abs >= q.sqTail {
			spare = append(spare, old[abs%uint64(len(old))])
		}
	}
	for abs := q.sqHead; abs < q.sqTail; abs++ {
		sq[abs%uint64(n)] = old[abs%uint64(len(old))]
	}
	for i := range sq {
		if sq[i] != nil {
			continue
		}
		if len(spare) > 0 {
			sq[i], spare = spare[len(spare)-1], spare[:len(spare)-1]
		} else {
			sq[i] = &swqe{sges: make([]verbs.SGE, 0, q.cap.MaxSendSGE)}
		}
	}
	q.sq = sq
}

func (q *QP) clearSlot(w *swqe) {
	sges, inline := w.sges[:0], w.inline[:0]
	*w = swqe{sges: sges, inline: inline}
}

func (q *QP) kick() {
	select {
	case q.wake <- struct{}{}:
		probe.Mark(probe.KickEng)
	default:
	}
}

// PostSend queues send work requests. When request i is refused, the ones before it are
// queued and transmitted all the same (as libibverbs providers ring the doorbell for them).
func (q *QP) PostSend(wrs []verbs.SendWR) error {
	_, err := q.post(wrs, postPlain)
	return err
}

// PostSendHeld is PostSend for messages that may wait for the QP's stream reader: while
// the reader has whole frames read ahead behind the one it delivers, what this posts is
// gathered with whatever else is posted meanwhile, and written when the reader is about to
// wait for the stream (tcpLink.letGo), or by the next poster that does not hold. A server
// whose handlers run where their requests were reaped sends its responses this way: one
// write for the responses to the requests one read brought in, rather than one each.
// Without a stream reader, or with nothing read ahead, it is PostSend.
func (q *QP) PostSendHeld(wrs []verbs.SendWR) error {
	_, err := q.post(wrs, postHeld)
	return err
}

// PostSendWait is PostSend for a goroutine that may wait for the socket and is certainly
// no stream reader (a handler that runs on a goroutine of its own): it writes what it
// posted itself, frames of any size included (a 1 MiB WRITE and the SEND that announces it
// leave in one writev, as the engine writes them), waiting while the socket is full,
// rather than leave a frame over the size a write that never waits may take to the NIC
// engine (a kick and a wake-up of another goroutine per large frame). It does so even
// while a stream reader of this device runs a completion handler: a server's reader that
// has just dispatched a request is still in it when the handler it started posts the
// response. A stream reader, a poller or a completion handler must not post this way: a
// goroutine that reaps must never block on a socket (two readers each writing to the
// other's full stream would deadlock). Nor should a caller with a deadline: the write
// waits for a peer that stopped reading until the link fails. It returns once the frames
// are written or the link failed; Destroy does not wait for a peer that stopped reading
// (it ends the write with a deadline: shutdownLocked).
func (q *QP) PostSendWait(wrs []verbs.SendWR) error {
	_, err := q.post(wrs, postWait)
	return err
}

// PostSendDeferred is PostSend for a message its poster knows others will follow at once
// (callers woken by one read of their responses, each about to post its next request): it
// is queued and not transmitted, and leaves with the next transmission on this QP, another
// poster's or Flush's, so that those messages share one write(2) rather than take one each.
// Its poster must see that one comes: Flush, once the messages it waited for are posted.
// Only where a write is a system call (a plain TCP socket) is it deferred: elsewhere (the
// shm fabric's ring, the in-process fabric, TLS) it is PostSend, and deferred is false.
func (q *QP) PostSendDeferred(wrs []verbs.SendWR) (deferred bool, err error) {
	return q.post(wrs, postDeferred)
}

// Flush transmits what PostSendDeferred queued, as PostSend would have.
func (q *QP) Flush() {
	if q.td != nil {
		q.td.enter()
		defer q.td.exit()
	}
	q.mu.Lock()
	l := q.link
	q.mu.Unlock()
	if l != nil {
		q.transmitInline(l, postPlain)
	}
}

// postHow says how a poster transmits what it posted.
type postHow uint8

const (
	postPlain    postHow = iota // PostSend: frames a write that never waits takes; larger ones are the engine's
	postHeld                    // PostSendHeld: as postPlain, or held for the stream reader
	postWait                    // PostSendWait: every frame, waiting for the socket, even while a stream reader reaps
	postDeferred                // PostSendDeferred: not at all; the next transmission takes it
)

// post is PostSend, PostSendHeld, PostSendWait or PostSendDeferred, as how says; it
// reports whether it left what it posted for the next transmission (postDeferred on a
// plain TCP socket; elsewhere postDeferred transmits as postPlain).
func (q *QP) post(wrs []verbs.SendWR, how postHow) (deferred bool, err error) {
	if q.td != nil {
		q.td.enter()
		defer q.td.exit()
	}
	q.mu.Lock()
	posted, err := q.postLocked(wrs)
	l := q.link
	q.mu.Unlock()
	if how == postDeferred {
		if tl, ok := l.(*tcpLink); ok && tl.raw != nil {
			return true, err
		}
		how = postPlain
	}
	if posted > 0 && l != nil {
		q.transmitInline(l, how)
	}
	return false, err
}

// postLocked queues wrs as post does and rings the doorbell; it returns how many it queued.
// q.mu is held.
func (q *QP) postLocked(wrs []verbs.SendWR) (int, error) {
	if probe.Enabled && len(wrs) > 0 {
		probe.MarkN(probe.PostSend, uint32(wrs[0].Opcode))
	}
	var err error
	posted := 0
	for i := range wrs {
		if e := q.postSend(&wrs[i]); e != nil {
			err = &verbs.PostError{Op: "post_send", Index: i, Err: e}
			break
		}
		posted++
	}
	if posted > 0 {
		q.db.ring(q.sqTail, q.rqTail)
	}
	return posted, err
}

// inlineTxMax is the largest frame payload a poster transmits on its own goroutine with a
// write that may wait for the socket; larger ones are left to the engine so that PostSend
// stays short. On a plain TCP stream (Linux) a poster writes frames of up to tryTxMax bytes
// itself with one writev that never waits (tcpLink.sendNow), as a 64 KiB eager message.
const inlineTxMax = 16 << 10

// transmitInline is the doorbell: when no one else is transmitting, the posting goroutine
// sends what it can itself, saving the hand-off to the engine goroutine. Anything it leaves
// (a large frame) is the engine's. A stream reader running a completion handler (an inline
// handler's response) sends only what the socket takes at once (transmitTryOnce). A poster that
// finds another transmitting leaves its work requests to that one (takeTx): the holder
// looks again once it let go, up to txRounds times, and only then wakes the engine.
func (q *QP) transmitInline(l link, how postHow) {
	for round := 0; q.transmitOnce(l, how); round++ {
		if round == txRounds {
			q.kick()
			return
		}
	}
}

// txRounds is how many times a poster transmits again for others who found txMu held
// while it transmitted (their work requests came in after its last step): a goroutine
// whose own work is sent does not stay to send everyone's.
const txRounds = 2

// takeTx takes txMu for a poster, or reports that it is held: the holder then transmits
// this poster's work requests, which were queued before the poster asked (txAgain), and
// looks at txAgain once it let go (letGoTx), so that one of the two sees the other. A
// holder that lets go with txAgain set is asked again. That saves the engine's wake-up
// (a futex wake of an idle thread on a many-core machine) every time two of a lane's
// callers post at once.
func (q *QP) takeTx() bool {
	if !q.txMu.TryLock() {
		q.txAgain.Store(true)
		if !q.txMu.TryLock() {
			return false
		}
	}
	q.txAgain.Store(false) // what those who asked queued is stepped from here on
	return true
}

// letGoTx lets go of txMu and reports whether a poster asked for another round.
func (q *QP) letGoTx() bool {
	q.txMu.Unlock()
	return q.txAgain.Load()
}

// transmitOnce is one round of transmitInline; it reports whether a poster asked for
// another.
func (q *QP) transmitOnce(l link, how postHow) bool {
	if how != postWait && q.dev.readersReaping.Load() > 0 {
		return q.transmitTryOnce(l, how == postHeld)
	}
	if !q.takeTx() {
		return false
	}
	probe.Mark(probe.TxInline)
	if how == postWait {
		return q.transmitWaiting(l)
	}
	tl, direct := l.(*tcpLink)
	direct = direct && directWrites && tl.raw != nil
	limit := inlineTxMax
	if direct { // frames up to tryTxMax go with a writev that never waits (tcpLink.sendNow)
		limit, tl.direct = tryTxMax, true
	}
	st := stepMore
	for st == stepMore && (!direct || tl.out == nil) {
		st = q.step(l, limit)
	}
	left := direct && tl.out != nil // the socket was full: what it left is the engine's
	if direct {
		tl.direct = false
	}
	if !left {
		q.flushTx(l)
	}
	again := q.letGoTx()
	if left { // the engine writes out first, then what the others asked for
		q.kick()
		return false
	}
	if st == stepDefer {
		q.kick()
	}
	return again
}

// transmitWaiting is transmitOnce for PostSendWait: the engine's round, on the poster's
// goroutine (no bound on a frame's size; a large frame kept for the flush, with the frames
// stepped after it). txMu is held on entry and let go; it reports whether a poster asked
// for another round.
func (q *QP) transmitWaiting(l link) bool {
	q.st.waitedPosts.Add(1)
	for q.step(l, 0) == stepMore {
	}
	q.flushTx(l)
	return q.letGoTx()
}

// tryTxMax is the largest frame payload a stream reader (transmitTryOnce), or on Linux any
// poster (transmitOnce), transmits itself with a write that never waits: a 64 KiB eager
// message and its envelope. Such a frame leaves straight from registered memory with one
// writev (tcpLink.sendNow) when nothing is gathered before it; a reader copies one behind
// gathered frames to the link's stage (about 2 µs for 64 KiB). The engine's wake-up it
// saves costs 7-10 µs across vCPUs.
const tryTxMax = 68 << 10

// transmitTryOnce is transmitInline while a stream reader runs a completion handler: the
// poster may be that reader, which must never block on a socket. It sends frames of up to
// tryTxMax bytes, gathered, with one write that does not wait (tcpLink.tryFlush); what the
// socket does not take at once, larger frames (a 1 MiB READ response), and everything on a
// link without a raw socket or a TryWriter (TLS, the in-process fabric) are the engine's. Saves the
// engine's wake-up on every response an inline handler sends.
//
// It is one round of transmitInline (for a poster that finds txMu held, see takeTx), and
// reports whether a poster asked for another. With hold (PostSendHeld), what it gathered
// is left for the QP's stream reader to write if the reader has frames read ahead
// (tcpLink.holdForReader).
func (q *QP) transmitTryOnce(l link, hold bool) bool {
	tl, ok := l.(*tcpLink)
	if !ok || (tl.raw == nil && tl.try == nil) {
		q.kick()
		return false
	}
	if !q.takeTx() {
		return false
	}
	probe.Mark(probe.TxInline)
	st := stepMore
	// Each step adds at most one frame: pend never reaches the size at which send would
	// flush it (and wait), and stage stays within a large frame or two.
	var done bool
	var err error
	for {
		tl.trying = true
		for st == stepMore && tl.out == nil && len(tl.pend) <= batchMax-headerLen-batchFrameMax && len(tl.stage) < batchMax {
			st = q.step(l, tryTxMax)
		}
		tl.trying = false
		// Held only in pend: what a writer that is not trying writes first (flush), so
		// nothing staged (a frame over batchFrameMax copied while trying, which only
		// tryFlush writes) may be left behind frames sent after it. Held only on a socket,
		// where a write is a system call: on a TryWriter (shm) a write is a copy into the
		// ring, and holding it only delays the response.
		if hold && tl.raw != nil && st == stepIdle && tl.out == nil && len(tl.stage) == 0 && tl.holdForReader() {
			done = true
			break
		}
		// Written in rounds of about batchMax: what a full round left waits for no one.
		if done, err = tl.tryFlush(); err != nil || !done || st != stepMore {
			break
		}
	}
	if err != nil {
		q.sendFailed(tl, err)
	}
	again := q.letGoTx()
	if err == nil && (!done || st != stepIdle) {
		q.kick()
	}
	return again && err == nil
}

// transmitTry is a stream reader's transmit: rounds of transmitTryOnce, as transmitInline.
func (q *QP) transmitTry(l link) {
	for round := 0; q.transmitTryOnce(l, false); round++ {
		if round == txRounds {
			q.kick()
			return
		}
	}
}

func (q *QP) postSend(wr *verbs.SendWR) error {
	if q.destroyed {
		return fmt.Errorf("soft: QP %d: %w", q.qpn, verbs.ErrClosed)
	}
	if err := q.checkSend(wr); err != nil {
		return err
	}
	switch q.state {
	case verbs.QPStateRTS:
	case verbs.QPStateError:
		q.scq.push(verbs.WorkCompletion{WRID: wr.WRID, Status: verbs.WCWRFlushErr, Opcode: wcOpcode(wr.Opcode), QPNum: q.qpn})
		return nil
	default:
		return fmt.Errorf("soft: QP %d is in state %v; post_send needs RTS (or ERR, which flushes): %w", q.qpn, q.state, verbs.ErrInvalid)
	}
	if q.sqTail-q.sqHead >= uint64(len(q.sq)) {
		if len(q.sq) >= q.cap.MaxSendWR {
			return fmt.Errorf("soft: QP %d: %d send work requests outstanding (max_send_wr): %w", q.qpn, len(q.sq), verbs.ErrQueueFull)
		}
		q.growSQ()
	}
	w := q.slot(q.sqTail)
	q.clearSlot(w)
	w.wr = *wr
	w.wr.SGL = nil
	w.sges = append(w.sges, wr.SGL...)
	w.rnrLeft = q.rnrRetry
	w.placeLarge = q.placeLarge.Load() // as its poster said (PlaceLargeSends)
	if wr.Flags&verbs.SendInline != 0 {
		for _, s := range wr.SGL {
			b, m, ok := q.resolveLocal(s, false)
			if !ok {
				return fmt.Errorf("soft: inline SGE {addr 0x%x len %d lkey 0x%x} is not inside a registered region of this PD: %w", s.Addr, s.Length, s.LKey, verbs.ErrInvalid)
			}
			w.inline = append(w.inline, b...)
			m.release(q.stripe)
		}
		q.st.copied.Add(uint64(len(w.inline)))
	}
	q.sqTail++
	return nil
}

// checkSend applies the checks libibverbs providers make at post time.
func (q *QP) checkSend(wr *verbs.SendWR) error {
	op := wr.Opcode
	if op == verbs.WRBindMW {
		switch {
		case q.typ != verbs.QPTypeRC:
			return fmt.Errorf("soft: BIND_MW on a %v QP (needs RC): %w", q.typ, verbs.ErrInvalid)
		case len(wr.SGL) > 0:
			return fmt.Errorf("soft: BIND_MW with %d SGEs (needs none): %w", len(wr.SGL), verbs.ErrInvalid)
		case wr.ImmData != 0:
			return fmt.Errorf("soft: BIND_MW with immediate data: %w", verbs.ErrInvalid)
		case wr.Bind.MW == nil:
			return fmt.Errorf("soft: BIND_MW without a window: %w", verbs.ErrInvalid)
		case wr.Bind.MW.Type() == verbs.MWType1 && wr.Bind.Access&verbs.AccessZeroBased != 0:
			return fmt.Errorf("soft: zero-based bind of a type-1 window: %w", verbs.ErrInvalid)
		}
		return nil
	}
	if q.typ != verbs.QPTypeRC {
		return fmt.Errorf("soft: %v on a %v QP: %w", op, q.typ, verbs.ErrUnsupported)
	}
	switch op {
	case verbs.WRSend, verbs.WRSendWithImm, verbs.WRSendWithInv, verbs.WRRDMAWrite, verbs.WRRDMAWriteWithImm, verbs.WRRDMARead:
	case verbs.WRLocalInv:
		if len(wr.SGL) > 0 {
			return fmt.Errorf("soft: LOCAL_INV with %d SGEs (needs none): %w", len(wr.SGL), verbs.ErrInvalid)
		}
		return nil
	default:
		return fmt.Errorf("soft: unknown opcode %v: %w", op, verbs.ErrInvalid)
	}
	if len(wr.SGL) > q.cap.MaxSendSGE {
		return fmt.Errorf("soft: %v with %d SGEs (max_send_sge %d): %w", op, len(wr.SGL), q.cap.MaxSendSGE, verbs.ErrInvalid)
	}
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Length)
	}
	if total > MaxMessage {
		return fmt.Errorf("soft: %v of %d bytes (max %d): %w", op, total, uint64(MaxMessage), verbs.ErrInvalid)
	}
	if wr.Flags&verbs.SendInline != 0 {
		if op == verbs.WRRDMARead {
			return fmt.Errorf("soft: inline RDMA_READ: %w", verbs.ErrInvalid)
		}
		if total > uint64(q.cap.MaxInlineData) {
			return fmt.Errorf("soft: inline %v of %d bytes exceeds max_inline_data %d: %w", op, total, q.cap.MaxInlineData, verbs.ErrInvalid)
		}
	}
	return nil
}

// PostRecv queues receive work requests.
func (q *QP) PostRecv(wrs []verbs.RecvWR) error {
	if q.td != nil {
		q.td.enter()
		defer q.td.exit()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	defer func() { q.db.ring(q.sqTail, q.rqTail) }()
	for i := range wrs {
		if err := q.postRecv(&wrs[i]); err != nil {
			return &verbs.PostError{Op: "post_recv", Index: i, Err: err}
		}
	}
	return nil
}

func (q *QP) postRecv(wr *verbs.RecvWR) error {
	switch {
	case q.destroyed:
		return fmt.Errorf("soft: QP %d: %w", q.qpn, verbs.ErrClosed)
	case q.srq != nil:
		return fmt.Errorf("soft: QP %d takes its receives from an SRQ; post them there: %w", q.qpn, verbs.ErrInvalid)
	case len(wr.SGL) > q.cap.MaxRecvSGE:
		return fmt.Errorf("soft: receive with %d SGEs (max_recv_sge %d): %w", len(wr.SGL), q.cap.MaxRecvSGE, verbs.ErrInvalid)
	case q.state == verbs.QPStateReset:
		return fmt.Errorf("soft: QP %d is in state RESET; post_recv needs INIT or later: %w", q.qpn, verbs.ErrInvalid)
	case q.state == verbs.QPStateError:
		q.rcq.push(verbs.WorkCompletion{WRID: wr.WRID, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPNum: q.qpn})
		return nil
	case q.rqTail-q.rqHead >= uint64(len(q.rq)):
		return fmt.Errorf("soft: QP %d: %d receives posted (max_recv_wr): %w", q.qpn, len(q.rq), verbs.ErrQueueFull)
	}
	r := &q.rq[q.rqTail%uint64(len(q.rq))]
	r.wrid = wr.WRID
	r.sges = append(r.sges[:0], wr.SGL...)
	q.rqTail++
	return nil
}

func wcOpcode(op verbs.WROpcode) verbs.WCOpcode {
	switch op {
	case verbs.WRRDMAWrite, verbs.WRRDMAWriteWithImm:
		return verbs.WCRDMAWrite
	case verbs.WRRDMARead:
		return verbs.WCRDMARead
	case verbs.WRBindMW:
		return verbs.WCBindMW
	case verbs.WRLocalInv:
		return verbs.WCLocalInv
	}
	return verbs.WCSend
}

// completeSQ generates the completions of finished work requests at the head of the send
// queue, in order. A failed one moves the QP to ERR. q.mu is held.
func (q *QP) completeSQ() {
	for q.sqHead < q.sqNext {
		w := q.slot(q.sqHead)
		if !w.done {
			return
		}
		failed := w.status != verbs.WCSuccess
		if failed || q.sigAll || w.wr.Flags&verbs.SendSignaled != 0 {
			q.scq.push(verbs.WorkCompletion{WRID: w.wr.WRID, Status: w.status, Opcode: wcOpcode(w.wr.Opcode), ByteLen: w.byteLen, QPNum: q.qpn})
		}
		q.clearSlot(w)
		q.sqHead++
		if failed {
			q.toError(0)
			return
		}
	}
}

// toError moves the QP to ERR: every outstanding send work request completes (the one in
// flight with inflight if that is not zero, the rest with WR_FLUSH_ERR, finished ones with
// their status) and every posted receive flushes: the one being placed first, then the
// receive queue's (an SRQ's receives stay in the SRQ). q.mu is held.
func (q *QP) toError(inflight verbs.WCStatus) {
	if q.state == verbs.QPStateError {
		return
	}
	q.state = verbs.QPStateError
	if f := q.onError; f != nil {
		q.onError = nil
		go f()
	}
	if q.rnrT != nil {
		q.rnrT.Stop()
	}
	for ; q.sqHead < q.sqTail; q.sqHead++ {
		w := q.slot(q.sqHead)
		st := w.status
		if !w.done {
			st = verbs.WCWRFlushErr
			if w.sent && inflight != 0 {
				st, inflight = inflight, 0
			}
		}
		if st != verbs.WCSuccess || q.sigAll || w.wr.Flags&verbs.SendSignaled != 0 {
			q.scq.push(verbs.WorkCompletion{WRID: w.wr.WRID, Status: st, Opcode: wcOpcode(w.wr.Opcode), ByteLen: w.byteLen, QPNum: q.qpn})
		}
		q.clearSlot(w)
	}
	q.sqNext = q.sqTail
	q.rdOut, q.halted, q.rnrWait = 0, false, false
	if q.rxTaken { // taken first, so flushed first: the only one of an SRQ's receives
		q.rxTaken = false
		wc := q.rxWC
		wc.Status = verbs.WCWRFlushErr
		q.rcq.push(wc)
	}
	for ; q.rqHead < q.rqTail; q.rqHead++ {
		r := &q.rq[q.rqHead%uint64(len(q.rq))]
		q.rcq.push(verbs.WorkCompletion{WRID: r.wrid, Status: verbs.WCWRFlushErr, Opcode: verbs.WCRecv, QPNum: q.qpn})
	}
	q.kick() // the engine still sends a queued NAK
}

// NotifyError implements verbs.ErrorNotifier.
func (q *QP) NotifyError(f func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state == verbs.QPStateError {
		go f()
		return
	}
	q.onError = f
}

var _ verbs.ErrorNotifier = (*QP)(nil)

// Fault returns why the QP moved to ERR on its own: a peer's request its responder refused
// (wrapping verbs.ErrRemoteAccess or verbs.ErrPeerProtocol), a malformed frame or a
// message cut off on the stream (verbs.ErrPeerProtocol); nil otherwise.
func (q *QP) Fault() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.fault
}

var _ verbs.FaultReporter = (*QP)(nil)

// linkDown handles the loss of the link: the peer is gone, as an RDMA CM disconnect or a
// transport retry timeout would report. The work request in flight completes with
// RETRY_EXC_ERR and the rest flush. fault, if set, says the peer broke the protocol on the
// stream (Fault reports it); left says the peer went away (PeerLeft reports it).
func (q *QP) linkDown(fault error, left bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed || q.state == verbs.QPStateReset || q.state == verbs.QPStateError {
		return
	}
	if fault != nil {
		q.setFault(fmt.Errorf("qp %d: %w", q.qpn, fault))
	} else if left {
		q.peerLeft = true
	}
	q.toError(verbs.WCRetryExcErr)
}

// sendFailed takes the link down after a send or flush on l failed with err: a peer that
// went away, or a link broken some other way (link.peerLeft tells).
func (q *QP) sendFailed(l link, err error) { q.linkDown(nil, l.peerLeft(err)) }

// PeerLeft implements verbs.PeerLeftReporter: the QP moved to ERR because the stream it
// runs over ended (the peer closed it, or its process exited), or the in-process peer
// went, rather than because the peer broke the protocol.
func (q *QP) PeerLeft() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.peerLeft
}

var _ verbs.PeerLeftReporter = (*QP)(nil)

// meansPeerLeft reports whether err, a link's read or write error, says the peer went away:
// the stream ended (in the middle of a frame too: a process killed while it wrote), the
// peer's end is gone (EPIPE, ECONNRESET), or the in-process peer QP a frame was handed to
// is (errLinkDown from its deliver: its close may not have reached this side yet).
func meansPeerLeft(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, errLinkDown)
}
