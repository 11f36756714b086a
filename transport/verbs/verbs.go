package verbs

import (
	"fmt"
	"net"
	"time"
)

// Device is an opened RDMA device (ibv_context): the NIC.
type Device interface {
	// Name is the device name, for example "soft0" or "rxe0".
	Name() string
	// Attr reports the device's limits.
	Attr() DeviceAttr
	// AllocPD allocates a protection domain.
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with room for at least cqe completions.
	CreateCQ(cqe int) (CQ, error)
	// Close releases the device. Every PD, CQ, QP, MR and MW must be released first.
	Close() error
}

// DeviceAttr reports a device's limits (a subset of ibv_device_attr).
type DeviceAttr struct {
	MaxQPWR         int    // send or receive queue depth
	MaxSGE          int    // scatter/gather elements per work request
	MaxCQE          int    // completion queue depth
	MaxMR           int    // memory regions
	MaxMRSize       uint64 // bytes in one memory region
	MaxMW           int    // memory windows
	MaxQPRdAtom     int    // max_dest_rd_atomic: READs a QP serves at once as responder
	MaxQPInitRdAtom int    // max_rd_atomic: READs a QP keeps outstanding as requester
	MaxInlineData   int    // largest inline send
	MWType2         bool   // type-2 memory windows are supported
	MaxSRQ          int    // shared receive queues (0: the device has none)
	MaxSRQWR        int    // receives one shared receive queue holds
	MaxSRQSGE       int    // scatter/gather elements per shared receive
	// ReadCrossover is the payload size up to which carrying bytes inside a SEND beats
	// exposing them for the peer's RDMA READ, where the provider knows it: 0 when a READ
	// costs what a NIC makes it cost (hardware, rxe) and the device's user picks. The
	// soft TCP fabric reports 64 KiB: there a READ is a round trip through the peer's
	// stream reader, two extra one-way trips, which a 64 KiB copy costs far less than.
	ReadCrossover int
}

// PD is a protection domain: MRs, MWs and QPs of one PD may be used together; a key of one
// PD is useless through a QP of another.
type PD interface {
	// RegMR registers buf (which must lie in memory from Map) with the given access.
	// AccessRemoteWrite and AccessRemoteAtomic require AccessLocalWrite, as in libibverbs.
	RegMR(buf []byte, access Access) (MR, error)
	// AllocMW allocates a memory window of type t.
	AllocMW(t MWType) (MW, error)
	// CreateQP creates a queue pair in state RESET.
	CreateQP(attr QPInitAttr) (QP, error)
	// Dealloc releases the PD. Its MRs, MWs and QPs must be released first.
	Dealloc() error
}

// MR is a registered memory region. Its bytes stay mapped and pinned until Dereg.
type MR interface {
	LKey() uint32   // the key for local access (SGEs)
	RKey() uint32   // the key peers use for RDMA on the region itself
	Addr() uint64   // the virtual address of Bytes()[0]
	Bytes() []byte  // the registered memory
	Access() Access // the rights it was registered with
	// Dereg deregisters the region. It fails with ErrBusy while a memory window is bound
	// to it (libibverbs returns EINVAL there).
	Dereg() error
}

// MW is a memory window: a remotely accessible view of part of an MR, cheap to bind and
// revoke.
type MW interface {
	Type() MWType
	// RKey is the key at allocation, or after the last successful type-1 Bind. As in
	// libibverbs, the owner of a type-2 window tracks the rkey it binds with BIND_MW itself.
	RKey() uint32
	// Bind binds a type-1 window through qp (ibv_bind_mw): it posts a bind work request
	// with the given id and flags and returns the window's new rkey. b.MW and b.RKey are
	// ignored.
	Bind(qp QP, wrid uint64, flags SendFlags, b MWBind) (uint32, error)
	// Dealloc releases the window, invalidating it if bound.
	Dealloc() error
}

// QPCap are the capacities of a queue pair.
type QPCap struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// QPInitAttr creates a queue pair.
type QPInitAttr struct {
	Type   QPType // QPTypeRC (the zero value means RC)
	SendCQ CQ
	RecvCQ CQ
	Cap    QPCap
	SigAll bool // every send work request generates a completion
	// SRQ, when not nil, is the shared receive queue the QP takes its receives from
	// instead of a receive queue of its own: Cap.MaxRecvWR and Cap.MaxRecvSGE are ignored
	// (Cap() reports 0 for them), and PostRecv on the QP fails with ErrInvalid. The SRQ
	// must belong to the QP's PD. Its receives still complete on RecvCQ.
	SRQ SRQ
}

// Endpoint is what a peer needs to connect its queue pair to this one: the QP number, the
// first packet sequence number this side will send, and the port's address.
type Endpoint struct {
	QPN uint32
	PSN uint32
	LID uint16
	GID [16]byte
}

// QPAttr drives a queue-pair state transition (ibv_modify_qp). Each transition reads the
// fields that belong to it and ignores the rest; zero values select the documented
// defaults.
type QPAttr struct {
	State QPState // the target state

	// RESET -> INIT
	Access Access // remote rights the QP grants its peer: AccessRemoteRead, AccessRemoteWrite
	Port   uint8  // physical port (1 when zero)

	// INIT -> RTR
	Remote          Endpoint      // the peer's QPN, first PSN and address
	PathMTU         int           // bytes: 256, 512, 1024, 2048 or 4096 (1024 when zero)
	MaxDestRdAtomic int           // READs served at once as responder; 0 refuses READs
	MinRNRTimer     time.Duration // how long a peer should wait before retrying a SEND we had no receive for

	// RTR -> RTS
	MaxRdAtomic int           // READs outstanding at once as requester; more are queued
	Timeout     time.Duration // local ACK timeout before a retry
	RetryCnt    int           // retries on ACK timeout before RETRY_EXC_ERR
	RNRRetry    int           // retries after receiver-not-ready before RNR_RETRY_EXC_ERR; 7 is infinite
}

// QP is a reliable-connected queue pair.
type QP interface {
	Num() uint32
	Type() QPType
	State() QPState
	Cap() QPCap
	PD() PD
	// Endpoint returns what the peer needs to connect to this QP (valid from INIT on).
	Endpoint() Endpoint
	// Modify moves the QP to attr.State. Only the libibverbs transitions are allowed:
	// RESET->INIT->RTR->RTS, any->ERR, any->RESET.
	Modify(attr QPAttr) error
	// PostSend queues send work requests in order. On failure it returns a *PostError
	// naming the first request that was not queued; the ones before it were.
	PostSend(wrs []SendWR) error
	// PostRecv queues receive work requests in order, reporting failure as PostSend does.
	// A QP created with an SRQ has no receive queue of its own and refuses it (ErrInvalid).
	PostRecv(wrs []RecvWR) error
	// Destroy flushes and releases the QP.
	Destroy() error
}

// StreamQP is implemented by queue pairs whose provider carries traffic over a byte stream
// the caller supplies (the soft TCP fabric). A connection manager hands such a QP the
// bootstrap connection after the endpoint exchange, before moving it to RTR.
type StreamQP interface {
	QP
	// NeedsStream reports whether the QP must be given a stream before RTR.
	NeedsStream() bool
	// AttachStream makes conn the QP's wire. The QP owns conn from then on and closes it
	// on Destroy.
	AttachStream(conn net.Conn) error
}

// ErrorNotifier is implemented by queue pairs whose provider tells their user when they
// move to ERR, as IBV_EVENT_QP_LAST_WQE_REACHED does for a QP on an SRQ: such a QP has no
// receives of its own to flush, so when nothing else is in flight no completion tells
// that the peer is gone.
type ErrorNotifier interface {
	// NotifyError makes f run once, on a goroutine of its own, after the QP moves to ERR
	// (at once if it is there already). A second call replaces f.
	NotifyError(f func())
}

// SRQAttr sizes a shared receive queue (ibv_srq_attr, less srq_limit: see SRQ.ArmLimit).
type SRQAttr struct {
	MaxWR  int // receives the queue holds
	MaxSGE int // scatter/gather elements per receive
	// AnyOrder says the consumer finds each receive by its completion's WRID and never
	// relies on post order, so the provider may hand out the most recently posted receive
	// first: a buffer posted again just after its last message was handled is still in the
	// CPU's caches when the next message lands in it, where in post order a queue of 256
	// large buffers cycles through megabytes that the caches no longer hold. The soft
	// provider does so; the others ignore it (devices consume in post order).
	AnyOrder bool
}

// SRQ is a shared receive queue (ibv_srq): one pool of receives that any number of RC
// queue pairs of its PD consume, so that a server's receive buffers do not grow with its
// connections. A SEND (or SEND_WITH_IMM, SEND_WITH_INV, WRITE_WITH_IMM) arriving on an
// attached QP takes the oldest receive posted to the SRQ (or, created with AnyOrder, any
// of them), whichever QP it comes for; the completion goes to that QP's receive CQ and
// names it in QPNum. When the SRQ is empty the QP answers with an RNR NAK, as it would
// with an empty receive queue of its own.
//
// Receives posted to an SRQ belong to it, not to a QP: destroying a QP, or its move to
// ERR, leaves them for the others (only a receive the QP had already consumed completes
// there, with an error status). The SRQ has no error state of its own.
type SRQ interface {
	// Cap returns the capacities the provider granted, at least those asked for.
	Cap() SRQAttr
	// PD returns the SRQ's protection domain.
	PD() PD
	// PostRecv queues receive work requests in order, reporting failure as QP.PostRecv
	// does: a *PostError naming the first request that was not queued.
	PostRecv(wrs []RecvWR) error
	// ArmLimit arms the SRQ's limit (ibv_modify_srq with IBV_SRQ_LIMIT): when a receive is
	// taken and fewer than n remain posted, LimitReached gets one token and the limit
	// disarms (IBV_EVENT_SRQ_LIMIT_REACHED), so that the consumer can post more before a
	// sender meets RNR. Arming never signals by itself: a limit above the receives posted
	// fires when the next one is taken. n 0 disarms it; n above Cap().MaxWR fails with
	// ErrInvalid.
	ArmLimit(n int) error
	// LimitReached returns the channel the armed limit signals on. It holds one token.
	LimitReached() <-chan struct{}
	// Destroy releases the SRQ. It fails with ErrBusy while a QP uses it; the receives
	// still posted are dropped without completions, as ibv_destroy_srq drops them.
	Destroy() error
}

// SRQCreator is implemented by the protection domains of providers that have shared
// receive queues (both of this module's do). It is a separate interface so that PD
// implementations without them (test fakes) stay valid; use CreateSRQ.
type SRQCreator interface {
	PD
	// CreateSRQ creates a shared receive queue on the PD (ibv_create_srq).
	CreateSRQ(attr SRQAttr) (SRQ, error)
}

// CreateSRQ creates a shared receive queue on pd, or fails with ErrUnsupported if pd's
// provider has none.
func CreateSRQ(pd PD, attr SRQAttr) (SRQ, error) {
	c, ok := pd.(SRQCreator)
	if !ok {
		return nil, fmt.Errorf("verbs: create SRQ: %T has no shared receive queues: %w", pd, ErrUnsupported)
	}
	return c.CreateSRQ(attr)
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs and returns how many. It never blocks
	// and does not allocate.
	Poll(wcs []WorkCompletion) (int, error)
	// ReqNotify arms the queue: the next completion added after this call sends one token
	// on Notify's channel (ibv_req_notify_cq). Poll again after arming to close the race.
	ReqNotify() error
	// Notify returns the event channel of the queue (a completion channel).
	Notify() <-chan struct{}
	// Cap returns the number of completions the queue holds.
	Cap() int
	// Destroy releases the queue. QPs using it must be destroyed first.
	Destroy() error
}

// CQResizer is implemented by completion queues that can grow while in use
// (ibv_resize_cq(3)): a consumer that sizes the queue for every work request its QPs may
// have outstanding grows it as QPs join, instead of reserving the most it might need up
// front. Use ResizeCQ.
type CQResizer interface {
	CQ
	// Resize makes the queue hold at least cqe completions; completions already queued
	// stay, in order. It fails with ErrInvalid when cqe exceeds the device's MaxCQE or
	// is less than the completions queued. Cap reports the new size.
	Resize(cqe int) error
}

// ResizeCQ resizes cq (ibv_resize_cq), or fails with ErrUnsupported when its provider
// cannot.
func ResizeCQ(cq CQ, cqe int) error {
	r, ok := cq.(CQResizer)
	if !ok {
		return fmt.Errorf("verbs: resize CQ: %T cannot be resized: %w", cq, ErrUnsupported)
	}
	return r.Resize(cqe)
}

// DirectCQ is implemented by completion queues whose provider can hand an armed queue's
// next completion straight to its consumer: instead of sending a token on Notify, the
// goroutine that added the completion calls the handler once it holds none of the
// provider's locks. A software NIC saves a goroutine hand-off per message this way; a
// hardware provider has no such goroutine and does not implement it.
type DirectCQ interface {
	CQ
	// SetArmedHandler registers fn (nil removes it). fn may run on any provider goroutine,
	// concurrently with Notify tokens from other completions; it must not block, and must
	// re-arm the queue (ReqNotify, then Poll) before it returns, as a woken poller would.
	SetArmedHandler(fn func())
}

// SGEFor returns the scatter/gather element for n bytes at offset off of mr.
func SGEFor(mr MR, off, n int) SGE {
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}

// WritePrefixer is implemented by memory windows that count what the peer's RDMA WRITEs
// covered through them: WrittenPrefix returns the length of the window's prefix, from its
// first byte, that WRITEs through it covered without a gap since it was last bound (a
// WRITE that starts past that prefix does not extend it). It is read once the window was
// invalidated: every WRITE that reached the window before the SEND_WITH_INV that revoked it
// counts. A receiver that exposes memory holding someone else's bytes for the peer to
// write a message into needs to clear only what the peer did not write (a grant for a
// written request), rather than all of it before exposing it.
type WritePrefixer interface {
	WrittenPrefix() uint64
}

// MemoryPinner is implemented by devices that can tell whether registering memory pins it
// (and so counts against RLIMIT_MEMLOCK). A software NIC pins nothing; hardware does.
type MemoryPinner interface {
	PinsMemory() bool
}

// BusyPoller is implemented by devices whose own goroutines wait for the wire and can poll
// it for a while before they park (the soft TCP fabric's stream readers): budget is how
// long, for QPs connected from then on; zero or negative, never.
type BusyPoller interface {
	SetBusyPoll(budget time.Duration)
}
