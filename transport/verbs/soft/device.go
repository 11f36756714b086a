// Package soft is a software RDMA NIC in pure Go: no cgo, runs anywhere. It implements the
// verbs model of package verbs with the semantics of real RC hardware (and of the kernel's
// rxe and siw drivers, where those follow the IBTA specification).
//
// Two fabrics connect its queue pairs:
//
//   - In-process (NewFabric): devices opened on one Fabric reach each other's QPs directly;
//     a transfer is one memcpy from registered memory to registered memory.
//   - TCP (OpenTCP): each QP is given a byte stream (the bootstrap connection, see package
//     cm); frames go from registered memory to the socket with writev and from the socket
//     into registered memory with no staging copy.
//
// Every remote access is checked by the target's engine, never by application code, the way
// hardware does: the key's index and key8, the object's state, the PD, the QP a type-2
// window is bound to, the access rights, the window bounds (as the IBTA says; rxe skips
// this) and the region bounds.
//
// Where a behaviour is the provider's choice it is documented on the type or in
// docs/verbs.md: for example, a QP whose stream or in-process peer goes away moves to ERR at
// once (outstanding work completes with RETRY_EXC_ERR, the rest flushes) instead of waiting
// for its retry timer, the way an RDMA CM disconnect event would be handled.
package soft

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Limits of a soft device.
const (
	maxQPWR       = 1 << 14
	maxSGE        = 16
	maxCQE        = 1 << 22 // mlx5's largest; a queue is allocated at the size asked, grown by Resize
	maxInlineData = 1024
	maxRdAtom     = 128
	maxKeys       = 1 << 24
	// MaxMessage is the largest single transfer (a SEND, WRITE or READ) a soft device moves.
	MaxMessage = 1<<31 - 1
)

// Fabric connects soft devices inside one process.
type Fabric struct {
	id uint32

	mu      sync.Mutex
	devices map[[16]byte]*Device
	next    uint32
}

var fabricIDs atomic.Uint32

// NewFabric returns an empty in-process fabric.
func NewFabric() *Fabric {
	return &Fabric{id: fabricIDs.Add(1), devices: make(map[[16]byte]*Device)}
}

// Open opens a new device on the fabric. QPs of devices on one fabric connect directly.
func (f *Fabric) Open(name string) (*Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	d := newDevice(name, f)
	d.gid[0], d.gid[1] = 0xfe, 0x80 // link-local style: fe80::<fabric>:<device>
	putU32(d.gid[8:], f.id)
	putU32(d.gid[12:], f.next)
	f.devices[d.gid] = d
	return d, nil
}

func (f *Fabric) lookup(gid [16]byte) *Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devices[gid]
}

func (f *Fabric) remove(d *Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.devices, d.gid)
}

// OpenTCP opens a device for the TCP fabric: each of its QPs carries traffic over the stream
// it is given (verbs.StreamQP), normally by cm.Connect.
func OpenTCP(name string) (*Device, error) {
	return newDevice(name, nil), nil
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}

// Device is a soft NIC. It implements verbs.Device.
type Device struct {
	name   string
	fabric *Fabric
	gid    [16]byte

	// keyMu guards the key table and the state of every MR and MW: binds and invalidations
	// take it for writing, rkey and lkey checks read-lock their QP's stripe.
	keyMu keyLock
	keys  []keyEntry // by key index; 0 is never used
	free  []uint32

	mu      sync.Mutex
	closed  bool
	objects int // live PDs and CQs
	srqs    int // live shared receive queues, against maxSRQ
	qps     map[uint32]*QP
	nextQPN uint32

	stats [statStripes]stats // a QP counts in stripe qpn % statStripes (QP.st)

	// readersReaping counts stream readers running a CQ's armed handler: while one does,
	// posters send only with writes that never wait (QP.transmitTryOnce, cq.endDefer).
	readersReaping atomic.Int32
	// busyPoll is SetBusyPoll's budget in nanoseconds; 0 or less: none.
	busyPoll atomic.Int64
}

// SetBusyPoll sets how long the stream readers of QPs connected from now on (TCP fabric)
// poll their socket for the next frame, after a small one, before they park, while the
// process is quiet (idle.Quiet: at least 4 Ps, few goroutines running or in system
// calls): zero or negative, the default, never. The budget fits itself to the waits
// (idle.NewFitSpinner). The transport sets it from its Config.BusyPoll.
func (d *Device) SetBusyPoll(budget time.Duration) { d.busyPoll.Store(int64(budget)) }

// busyPollBudget is the budget a stream reader connected now gets.
func (d *Device) busyPollBudget() time.Duration { return max(0, time.Duration(d.busyPoll.Load())) }

type keyEntry struct {
	mr *mr
	mw *mw
}

func newDevice(name string, f *Fabric) *Device {
	return &Device{name: name, fabric: f, keys: make([]keyEntry, 1), qps: make(map[uint32]*QP), nextQPN: 0x11}
}

// Name returns the device name.
func (d *Device) Name() string { return d.name }

// Attr reports the device's limits.
func (d *Device) Attr() verbs.DeviceAttr {
	return verbs.DeviceAttr{
		MaxQPWR: maxQPWR, MaxSGE: maxSGE, MaxCQE: maxCQE, MaxMR: maxKeys, MaxMW: maxKeys,
		MaxMRSize: MaxMessage, MaxQPRdAtom: maxRdAtom, MaxQPInitRdAtom: maxRdAtom,
		MaxInlineData: maxInlineData, MWType2: true,
		MaxSRQ: maxSRQ, MaxSRQWR: maxSRQWR, MaxSRQSGE: maxSGE,
		ReadCrossover: d.readCrossover(),
	}
}

// tcpReadCrossover is where a SEND stops beating a READ on the TCP fabric: a 64 KiB echo
// across two processes took 311 µs through windows and READs and 165 µs inside SENDs
// (docs/performance.md); a READ there costs two one-way trips through the peers' stream
// readers, and a 64 KiB copy about 3 µs.
const tcpReadCrossover = 64 << 10

// readCrossover is the device's verbs.DeviceAttr.ReadCrossover: the TCP fabric's, or 0
// in process, where no crossover has been measured and the transport keeps its defaults.
func (d *Device) readCrossover() int {
	if d.fabric == nil {
		return tcpReadCrossover
	}
	return 0
}

// Stats counts the payload bytes the device moved, by how it moved them.
type Stats struct {
	// SocketTxBytes and SocketRxBytes are payload bytes written to or read from a TCP
	// stream straight from or into registered memory: the one unavoidable copy at the
	// socket boundary.
	SocketTxBytes uint64
	SocketRxBytes uint64
	// CopyBytes are payload bytes copied in user space: in-process transfers (one memcpy
	// from the source region to the target region) and inline data copied at post time.
	CopyBytes uint64
	// DiscardBytes are payload bytes read from a stream and thrown away (dropped or
	// refused frames).
	DiscardBytes uint64
	// RNRNaks counts receiver-not-ready NAKs this device's QPs sent: a SEND arrived with no
	// receive posted, and its sender must retry it after the RNR timer.
	RNRNaks uint64
	// PlacedBytes are payload bytes this device's QPs copied straight between their own
	// memory and a same-host peer's shared memory: placed READs they served, placed WRITEs
	// and SENDs they received (one copy each, counted nowhere else).
	PlacedBytes uint64
	// Writes counts the writes on the QPs' streams (write(2) and writev(2) calls on TCP,
	// TryWrite on the shm fabric's): the frames gathered into one write count once.
	Writes uint64
	// EngineWakes counts the times a QP's NIC engine goroutine woke to transmit what a
	// poster left it (a frame too large to write at once, a socket that was full, or a
	// transmit in progress): each is a goroutine hand-off on the send path.
	EngineWakes uint64
	// WaitedPosts counts the transmit rounds PostSendWait posters ran themselves, waiting
	// for the socket as the engine does (a large WRITE written by the goroutine that posted
	// it, with no engine wake-up).
	WaitedPosts uint64
	// BoundedPosts counts the transmit rounds PostSendBounded posters (callers) ran
	// themselves; BoundedCut those of them whose context ended while the socket was full,
	// leaving the rest of the frame to the engine.
	BoundedPosts uint64
	BoundedCut   uint64
	// BusyPolled counts the reads a stream reader made while polling its socket for the
	// next frame that brought bytes (SetBusyPoll): each is a park and wake-up saved.
	BusyPolled uint64
	// DelayedAcks counts the ACKs this device's QPs let wait the whole delayed-ACK timer
	// (1 ms) for a frame of theirs to carry them: the tail of a stream of SENDs nobody
	// answers, whose sender waits that long for those completions. A sender whose send
	// queue is half unacknowledged asks for its ACK at once instead (an ACK request).
	DelayedAcks uint64
}

// stats is one stripe of a device's counters. Every frame a QP sends or receives adds to
// them, so the QPs of one device (a Client's lanes, a server's connections, each with its
// own reader on its own core) count in stripes of their own: one set of counters that
// every QP added to was a cache line every core wrote on every message.
type stats struct {
	socketTx, socketRx, copied, discarded, rnrNaks, placed, writes, engineWakes, waitedPosts atomic.Uint64
	boundedPosts, boundedCut, busyPolled, delayedAcks                                        atomic.Uint64
	_                                                                                        [cacheLine - 13*8]byte
}

// statStripes is how many stripes a device's counters have: QPs made one after another
// (a Client's lanes) count in different ones up to this many.
const statStripes = 16

// cacheLine is what a stripe is padded to: two 64-byte lines, as the adjacent-line
// prefetcher of x86 cores pulls pairs.
const cacheLine = 128

// Stats returns the device's copy counters.
func (d *Device) Stats() Stats {
	var s Stats
	for i := range d.stats {
		st := &d.stats[i]
		s.SocketTxBytes += st.socketTx.Load()
		s.SocketRxBytes += st.socketRx.Load()
		s.CopyBytes += st.copied.Load()
		s.DiscardBytes += st.discarded.Load()
		s.RNRNaks += st.rnrNaks.Load()
		s.PlacedBytes += st.placed.Load()
		s.Writes += st.writes.Load()
		s.EngineWakes += st.engineWakes.Load()
		s.WaitedPosts += st.waitedPosts.Load()
		s.BoundedPosts += st.boundedPosts.Load()
		s.BoundedCut += st.boundedCut.Load()
		s.BusyPolled += st.busyPolled.Load()
		s.DelayedAcks += st.delayedAcks.Load()
	}
	return s
}

func (d *Device) use() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("soft: device %s: %w", d.name, verbs.ErrClosed)
	}
	d.objects++
	return nil
}

func (d *Device) unuse() {
	d.mu.Lock()
	d.objects--
	d.mu.Unlock()
}

// Close releases the device. It fails with verbs.ErrBusy while PDs, CQs or QPs remain.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("soft: close device %s: %w", d.name, verbs.ErrClosed)
	}
	if d.objects > 0 || len(d.qps) > 0 {
		return fmt.Errorf("soft: close device %s: %d PDs/CQs and %d QPs still open: %w", d.name, d.objects, len(d.qps), verbs.ErrBusy)
	}
	d.closed = true
	if d.fabric != nil {
		d.fabric.remove(d)
	}
	return nil
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (verbs.PD, error) {
	if err := d.use(); err != nil {
		return nil, err
	}
	return &pd{dev: d}, nil
}

// CreateCQ creates a completion queue for cqe completions.
func (d *Device) CreateCQ(cqe int) (verbs.CQ, error) {
	if cqe <= 0 || cqe > maxCQE {
		return nil, fmt.Errorf("soft: create CQ of %d entries (1..%d): %w", cqe, maxCQE, verbs.ErrInvalid)
	}
	if err := d.use(); err != nil {
		return nil, err
	}
	return newCQ(d, cqe), nil
}

// addKey stores an MR or MW in the key table and returns its index. keyMu must be held.
func (d *Device) addKey(e keyEntry) (uint32, error) {
	if n := len(d.free); n > 0 {
		i := d.free[n-1]
		d.free = d.free[:n-1]
		d.keys[i] = e
		return i, nil
	}
	if len(d.keys) >= maxKeys {
		return 0, fmt.Errorf("soft: %d keys in use: %w", maxKeys-1, verbs.ErrNoMemory)
	}
	d.keys = append(d.keys, e)
	return uint32(len(d.keys) - 1), nil
}

// dropKey frees a key index. keyMu must be held.
func (d *Device) dropKey(i uint32) {
	d.keys[i] = keyEntry{}
	d.free = append(d.free, i)
}

// entry returns the table entry of key's index. keyMu must be held (read or write).
func (d *Device) entry(key uint32) keyEntry {
	i := verbs.KeyIndex(key)
	if i == 0 || int(i) >= len(d.keys) {
		return keyEntry{}
	}
	return d.keys[i]
}

func randomKey8() uint8 { return uint8(rand.Uint32()) }

// pd is a protection domain.
type pd struct {
	dev   *Device
	users verbs.Users // MRs, MWs, QPs and SRQs
}

func (p *pd) use() error { return p.users.Acquire("soft: PD") }
func (p *pd) unuse()     { p.users.Release() }

func (p *pd) Dealloc() error {
	if err := p.users.Close("soft: dealloc PD", "MRs, MWs, QPs or SRQs", nil); err != nil {
		return err
	}
	p.dev.unuse()
	return nil
}

// PinsMemory reports false: the software NIC reads and writes registered memory like any
// other, so it neither pins it nor counts it against RLIMIT_MEMLOCK (verbs.MemoryPinner).
func (d *Device) PinsMemory() bool { return false }
