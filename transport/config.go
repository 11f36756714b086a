package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/credentials"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// PollMode is how a poller waits when its completion queue is empty.
type PollMode uint8

// Poll modes.
const (
	// PollAdaptive arms the completion queue and parks until the next completion, after
	// spinning for SpinTime if one is set (zero, the default, spins not at all) and the
	// machine has cores to spare (GOMAXPROCS at least twice the pollers plus two). A
	// spinning poller is the queue of its transport: it keeps its P, so every caller or
	// handler it wakes waits to be stolen by another P, while a parked one lets the
	// stream reader that delivered a completion dispatch it (verbs.DirectCQ). Measured
	// with two processes on 16 cores (8 each), 64 B at 16 callers: 129k calls/s, p99
	// 635µs spinning for 50µs; 231k, p99 163µs parking at once. On 2 cores a 50µs spin
	// made a 64 B call 30x slower.
	PollAdaptive PollMode = iota
	// PollBusy spins without ever parking: lowest latency, one core per poller.
	PollBusy
	// PollEvent always parks on the completion queue's event channel.
	PollEvent
)

// String returns "adaptive", "busy" or "event".
func (m PollMode) String() string {
	switch m {
	case PollAdaptive:
		return "adaptive"
	case PollBusy:
		return "busy"
	case PollEvent:
		return "event"
	}
	return fmt.Sprintf("PollMode(%d)", uint8(m))
}

// Errors returned by calls; match them with errors.Is.
var (
	// ErrUnavailable: the connection failed (the peer died or broke the protocol) or was
	// closed. The call may or may not have run.
	// It stands for code Unavailable: errors.Is matches it and rpc.ErrUnavailable (or a
	// status of that code) both ways.
	ErrUnavailable error = &codeError{StatusUnavailable, "mwrpc: connection unavailable"}
	// ErrNotSent: a call or stream failed before any of it was sent, its connection
	// already failed or closed when it came (matched beside ErrUnavailable, which the
	// error is too). Nothing of it reached the peer: it may be sent again on another
	// connection, as the rpc layer does (gRPC's transparent retry).
	ErrNotSent = errors.New("mwrpc: nothing was sent")
	// ErrTooLarge: a payload exceeds the maximum message size of this side or the peer's.
	ErrTooLarge = wire.ErrTooLarge
	// ErrHandshake: the peer is not an mwrpc transport of a compatible version.
	ErrHandshake = errors.New("mwrpc: handshake failed")
	// ErrCapacity: a new connection would exceed Config.MaxConns or over-commit the
	// pollers' completion queues (wrapped with ErrUnavailable). Raise Config.Pollers or
	// MaxConns, or lower Credits and Windows.
	ErrCapacity = errors.New("transport at capacity")
	// ErrRefused: the server turned the connection away before setting it up, at its
	// MaxConns or MaxConnsPerHost or while shutting down (wrapped with ErrUnavailable);
	// the error says which. Retry later, or elsewhere.
	ErrRefused = wire.ErrRefused
	// ErrProtocol: the connection failed because the peer broke the protocol: a
	// malformed message, a window revoked that was never exposed, more credits returned
	// than given, or a remote access the NIC refused (verbs.ErrRemoteAccess, a bad or
	// stale rkey). Wrapped with ErrUnavailable.
	ErrProtocol = errors.New("the peer broke the protocol")
)

// Config tunes a Transport. The zero value is usable.
type Config struct {
	// SlotSize is the size of each receive slot: the largest SEND this side accepts
	// (header included). Zero means DefaultSlotSize, or with shared receives on a device
	// that reports a verbs.DeviceAttr.ReadCrossover (the soft TCP fabric: 64 KiB) that
	// crossover plus envelopeRoom (66 KiB), so that payloads up to it travel inside the
	// SEND, with no window and no READ.
	SlotSize int
	// Credits is the number of receive slots posted per connection: how many SENDs the
	// peer may have outstanding. Zero means DefaultCredits.
	Credits int
	// SharedReceives, when positive, makes each poller post this many receive slots to
	// one shared receive queue (SRQ) that all its connections take their receives from,
	// instead of Credits + 32 slots per connection: receive memory stops growing with the
	// connections (a server with many mostly idle ones). Peers still get Credits credits
	// each; when more of them send at once than there are slots, the NIC refuses the
	// SEND that finds the queue empty and the sender's NIC retries it after its RNR timer:
	// delayed, never lost. Size it for the messages in flight at once, across
	// connections. Needs a device with SRQs (verbs.SRQCreator). A shared slot a request
	// or response would hold while more than half of them are held is copied out to a
	// pool buffer and reposted at once, so that slow handlers or callers (a hostile peer's
	// among them) cannot empty the queue. Zero means DefaultSharedReceives on a device
	// that reports a ReadCrossover (the soft TCP fabric, where the slots grow to carry
	// 64 KiB), else off; negative means off.
	SharedReceives int
	// EagerThreshold is the largest payload sent inside a SEND; larger ones go through a
	// memory window. It is capped by the peer's slot size. Zero means DefaultEagerThreshold,
	// or the slot size minus the header when the slot size was grown to the device's
	// ReadCrossover.
	EagerThreshold int
	// MaxMessage is the largest payload this side sends or accepts. Zero means
	// DefaultMaxMessage.
	MaxMessage int
	// Windows is the number of type-2 memory windows per connection: large messages
	// exposed at once. Zero means DefaultWindows.
	Windows int
	// StreamWindow is how many bytes of a stream's messages this side takes before the
	// sender must wait for it to consume some (per stream, each way it receives): what a
	// slow reader costs in memory, and what keeps a fast sender's pipe full. Messages above
	// the eager threshold count too, each bound in a window of its own until READ. Zero
	// means DefaultStreamWindow; 64 KiB to 64 MiB.
	StreamWindow int
	// Lease bounds how long a window stays exposed waiting for the peer's release before
	// LOCAL_INV reclaims it. Zero means DefaultLease. A peer releases with SEND_WITH_INV
	// only within half the lease; later it releases without invalidating and the lease
	// reclaims, so that no window is ever invalidated twice.
	Lease time.Duration
	// GrantBytes bounds the registered memory this side grants its callers, all
	// connections together, to write their next large request into (written requests: on
	// a device where a READ costs a round trip through the peer's CPU, such as the soft
	// TCP fabric). A connection holds one grant at most, of at most 16 MiB; a request the
	// grants do not cover is READ from the caller's window instead. Zero means
	// DefaultGrantBytes; negative turns grants off.
	GrantBytes int64
	// Pollers is the number of poller goroutines, each with its completion queue (and
	// shared receive queue) that connections are spread over; zero means one per two
	// cores, from 1 to 4 (GOMAXPROCS/2). Measured with two processes on 16 cores (8
	// each), 64 B at 16 callers over one rpc.Client: 231k calls/s with one poller a side,
	// 319k with four. Each poller costs its shared receive slots (16.5 MiB on the soft
	// TCP fabric), hence the cap; on 2 cores the default is one poller.
	Pollers int
	// CQDepth is the initial size of each poller's completion queue; zero means 65536, or
	// the device's maximum when that is smaller (Soft-RoCE: 32767). A connection commits
	// as many entries as it has work requests outstanding at most (324 with the defaults
	// and shared receives, 420 without); when every queue is committed, the least
	// committed one grows (ibv_resize_cq: doubling, up to the device's MaxCQE; 4 Mi
	// entries of 40 bytes on a soft device), and only where none can does a dial or
	// accept fail with ErrCapacity, since an overrun queue loses completions.
	CQDepth int
	// PollMode is how pollers wait; the zero value is PollAdaptive.
	PollMode PollMode
	// SpinTime is how long an adaptive poller spins before parking, on a machine with
	// cores to spare (see PollAdaptive); zero means it parks at once.
	SpinTime time.Duration
	// BusyPoll is how long a caller polls for its response before it parks, and how long
	// the goroutines that wait for the wire poll it (verbs.BusyPoller: the soft TCP
	// fabric's stream readers; the shm fabric's ring readers, shm.Config.QuietSpin), while
	// the process is quiet (idle.Quiet: at least 4 Ps, and at most half of them less one
	// goroutines running, runnable or in system calls in two readings in a row) and the
	// call or the last frame is small (up to 4 KiB). On a quiet many-core machine a park
	// and wake-up costs 5-20 µs, most of a small call. Zero or negative, the default, never
	// polls; 50 µs is about a small call's round trip. Measured with two processes on 16
	// cores (8 each), 3 pairs of runs (docs/performance.md): 64 B at one caller 36.5 ->
	// 33.2 µs over soft TCP and 22.6 -> 16.5 µs over shm, but 8% fewer calls at 64
	// callers over soft TCP and 4-6% fewer over shm at 16 and 64, where the load's gaps
	// still look quiet; hence off unless asked for. With fewer than 4 Ps nothing polls.
	BusyPoll time.Duration
	// SHMSpin is how long a shm ring's reader or writer polls before it sleeps on its
	// doorbell, on connections over the shm fabric (shm.Config.Spin, which says how the
	// spin adapts). Zero: shm.DefaultSpin, 50 µs, with which one caller's small calls
	// meet a polling peer and take about 4 µs on 2 cores rather than 60; a connection
	// with calls less than that apart then keeps a core busy on each side. Negative:
	// never spin (every wait sleeps).
	SHMSpin time.Duration
	// Handlers bounds concurrently running handlers; zero means 256 × GOMAXPROCS. When
	// all are busy a request is answered with StatusResourceExhausted.
	Handlers int
	// InlineHandlers runs each request's handler on the goroutine that reaped it (the
	// poller, or the soft TCP fabric's stream reader) instead of handing it to the
	// handler pool: run to completion, a goroutine wake-up less per call (64 B calls at
	// concurrency 16 across processes: about 1.3x the throughput, docs/tuning.md). Only
	// for handlers that never block: while one runs, no other connection of its poller is
	// served, and it does not see its caller's cancellation. The response never waits: it
	// goes out on a credit taken before the handler runs (with none free, the request goes
	// to the pool as usual), its buffer is taken without waiting, and a large one that
	// finds every window exposed is sent from a goroutine of its own.
	InlineHandlers bool
	// InlineBudget is the adaptive version of InlineHandlers, on by default: a handler
	// that implements InlineAdvisor (the rpc server does) runs a request inline when its
	// method's last 64 runs each took less than InlineBudget, as the last completion of a
	// poller's batch, with the poller's queue lent to the NIC's goroutines while it runs
	// (on soft fabrics they reap what arrives meanwhile); one run over the budget sends the
	// method back to the handler pool until it has 64 short runs again. Zero means
	// DefaultInlineBudget; negative turns it off.
	InlineBudget time.Duration
	// Pool configures the registered buffer pool. Its MaxBytes must hold every
	// connection's receive slots and the large messages in flight.
	Pool pool.Config
	// Connect are the queue-pair attributes; the zero value means cm.DefaultParams().
	Connect cm.Params
	// MaxCallsPerConn bounds the calls one connection may have in its handlers at once;
	// beyond it a request is answered StatusResourceExhausted without running, so that no
	// single peer takes the whole handler pool. Zero means a quarter of Handlers (at
	// least Credits: small requests never exceed that, each holding a receive slot).
	MaxCallsPerConn int
	// MaxCallsPerHost bounds the calls all the connections Serve accepted from one peer
	// IP address may have in the handlers at once, answered like MaxCallsPerConn beyond
	// it: a host cannot take the handler pool by opening more connections, and the rest
	// stays for other hosts. Zero means three quarters of Handlers (all of them below 4).
	MaxCallsPerHost int
	// CreditTimeout is how long a response may wait for the peer to return a credit
	// (repost a receive) before the connection is failed as stalled and its handlers
	// released: a peer that stops reading replies cannot hold the handler pool. Zero
	// means DefaultCreditTimeout.
	CreditTimeout time.Duration
	// HandshakeTimeout bounds connection setup; zero means 10s. A peer that connects and
	// then says nothing, or stops halfway through the hello or the TLS handshake, is
	// dropped after it.
	HandshakeTimeout time.Duration
	// MaxConns bounds the connections the transport holds at once, set up or being set
	// up, made by Dial or accepted by Serve. Serve turns a connection beyond it away at
	// once, before any handshake, with a refusal the client reports as ErrRefused; Dial
	// fails with ErrCapacity. Zero means DefaultMaxConns where connections share the
	// pollers' receive queues (SharedReceives: an idle connection registers no memory)
	// and the completion queues can grow to hold them (the soft provider's can); else as
	// many as the pollers' completion queues hold (Pollers × CQDepth over a connection's
	// share: about 156 per poller at the defaults), since each connection then posts
	// receives of its own. docs/security.md says how to size it for untrusted networks.
	MaxConns int
	// MaxConnsPerHost bounds the connections Serve holds from one peer IP address, so that
	// no single host takes the whole connection table; beyond it a connection is turned
	// away like one beyond MaxConns. Zero means a quarter of MaxConns (at least 1): 2,500
	// at the default MaxConns, so that a sidecar proxy or a NAT that brings many clients
	// from one address is served.
	MaxConnsPerHost int
	// ConnRatePerHost bounds how fast one peer IP address may open connections Serve
	// takes: a bucket of MaxConnsPerHost connections that refills at this many a second.
	// A connection beyond it is turned away before any handshake, as beyond MaxConns: a
	// host that sets connections up and drops them over and over cannot spend the
	// server's CPU on setups. Zero means DefaultConnRatePerHost.
	ConnRatePerHost float64
	// IdleTimeout is how long a connection Serve accepted may go without a request
	// before the server sends GOAWAY (the client's rpc layer moves to a new connection)
	// and, if the peer still holds on, closes it: idle connections cannot keep the table
	// full forever. Keepalive pings do not count as requests. Zero means
	// DefaultIdleTimeout; negative means never.
	IdleTimeout time.Duration
	// Keepalive is a server's keepalive policy: the most age a connection may reach and
	// how often a client may ping (see ServerKeepalive). The zero value is gRPC's
	// defaults. Serve applies it to the connections it accepts.
	Keepalive ServerKeepalive
	// PeerTimeout is how long a silent peer host has before its connections fail with
	// ErrUnavailable: TCP keepalive on the bootstrap connection, which each side keeps
	// open (unless it is the QP's wire) and watches, so that a peer process that exits or
	// closes the connection is noticed at once, as an RDMA CM disconnect would be. An idle
	// RDMA QP notices nothing by itself. Keepalive needs a *net.TCPConn (what Dial and
	// Serve use); over another stream given to NewConn only its end is noticed. Zero
	// means DefaultPeerTimeout.
	PeerTimeout time.Duration
	// Credentials, if set, secure the bootstrap connection of every connection Dial makes
	// and Serve accepts (TLS: credentials.NewTLS) before anything else crosses it: the
	// hello, the queue-pair endpoints, and on the soft TCP fabric every message after
	// them. Both sides must use them. NewConn takes its stream as it is.
	Credentials credentials.TransportCredentials
	// Logger receives what has no caller to return to: connections Serve could not set
	// up, and why an established connection failed other than by Close (Warn; Debug
	// when the peer closed its side). Nil means slog.Default().
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultSlotSize       = 16 << 10
	DefaultEagerThreshold = DefaultSlotSize - wire.HeaderLen
	DefaultCredits        = 64
	DefaultMaxMessage     = 64 << 20
	DefaultWindows        = 64
	DefaultStreamWindow   = 4 << 20
	DefaultInlineBudget   = 20 * time.Microsecond
	// DefaultSharedReceives: on the soft TCP fabric, 256 slots of 66 KiB (16.5 MiB per
	// poller) hold four connections' full credit windows of 64 KiB messages at once, and
	// any number of connections' usual traffic.
	DefaultSharedReceives = 256
	DefaultLease          = 10 * time.Second
	// DefaultGrantBytes: written requests for up to four connections' 16 MiB calls, or
	// sixty-four connections' 1 MiB ones, a quarter of the pool's default MaxBytes.
	DefaultGrantBytes    = 64 << 20
	DefaultPeerTimeout   = 15 * time.Second
	DefaultCreditTimeout = 10 * time.Second
	DefaultIdleTimeout   = 5 * time.Minute
	// DefaultMaxConns: what a server holds by default where connections share receive
	// queues, as gRPC-Go and Kitex servers hold tens of thousands. An idle connection
	// costs about 43 KiB of Go heap a side and 13 KiB of completion queue on the server
	// (TestTenThousandConns).
	DefaultMaxConns = 10000
	// DefaultConnRatePerHost: a reconnecting client needs a few a second; a setup and
	// teardown take about 0.45 ms of both sides together (BenchmarkConnSetup, 2 cores),
	// so one host's churn at this rate takes under 5% of a core.
	DefaultConnRatePerHost = 100
)

// envelopeRoom is what a slot grown to a device's ReadCrossover holds beyond it: the
// transport's header and an rpc envelope (method, metadata) around a payload of exactly
// the crossover.
const envelopeRoom = 2 << 10

// SHM returns the shm fabric's configuration of this transport's connections over it
// (Dial's shm:// targets; rpc.Server.ListenAndServe's): their rings' spin (SHMSpin) and
// busy polling (BusyPoll).
func (c Config) SHM() shm.Config {
	return shm.Config{Spin: c.SHMSpin, QuietSpin: c.BusyPoll}
}

// sizeReceives fills in SharedReceives, SlotSize and EagerThreshold: on a device that
// reports a ReadCrossover, shared receives with slots grown to carry it.
func (c *Config) sizeReceives(dev verbs.DeviceAttr) {
	crossover := dev.ReadCrossover > DefaultEagerThreshold && dev.MaxSRQ > 0
	switch {
	case c.SharedReceives < 0:
		c.SharedReceives = 0
	case c.SharedReceives == 0 && crossover:
		c.SharedReceives = min(DefaultSharedReceives, dev.MaxSRQWR)
	}
	grown := false
	if c.SlotSize == 0 {
		c.SlotSize = DefaultSlotSize
		// Big slots only where they do not multiply with the connections.
		if crossover && c.SharedReceives > 0 {
			c.SlotSize, grown = dev.ReadCrossover+envelopeRoom, true
		}
	}
	if c.EagerThreshold == 0 {
		c.EagerThreshold = min(DefaultEagerThreshold, c.SlotSize-wire.HeaderLen)
		if grown {
			c.EagerThreshold = c.SlotSize - wire.HeaderLen
		}
	}
}

// withDefaults fills in the zero fields for a transport on a device with attributes dev,
// and checks the result.
func (c Config) withDefaults(dev verbs.DeviceAttr) (Config, error) {
	c.sizeReceives(dev)
	if c.Credits == 0 {
		c.Credits = DefaultCredits
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = DefaultMaxMessage
	}
	if c.Windows == 0 {
		c.Windows = DefaultWindows
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.GrantBytes == 0 {
		c.GrantBytes = DefaultGrantBytes
	}
	if c.StreamWindow == 0 {
		c.StreamWindow = DefaultStreamWindow
	}
	if c.Pollers == 0 {
		c.Pollers = min(max(1, runtime.GOMAXPROCS(0)/2), 4)
	}
	if c.Handlers == 0 {
		c.Handlers = 256 * runtime.GOMAXPROCS(0)
	}
	if c.Connect == (cm.Params{}) {
		c.Connect = cm.DefaultParams()
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.ConnRatePerHost == 0 {
		c.ConnRatePerHost = DefaultConnRatePerHost
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.Keepalive.MinPingInterval == 0 {
		c.Keepalive.MinPingInterval = DefaultMinPingInterval
	}
	if c.CreditTimeout == 0 {
		c.CreditTimeout = DefaultCreditTimeout
	}
	if c.MaxCallsPerHost == 0 {
		c.MaxCallsPerHost = c.Handlers
		if c.Handlers >= 4 {
			c.MaxCallsPerHost = c.Handlers * 3 / 4
		}
	}
	if c.MaxCallsPerConn == 0 {
		c.MaxCallsPerConn = max(c.Handlers/4, c.Credits)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, c.check()
}

// check says what is wrong with a configuration whose defaults are filled in.
func (c *Config) check() error {
	switch {
	case c.SlotSize < wire.HeaderLen+64 || c.SlotSize > 1<<24:
		return fmt.Errorf("mwrpc: slot size %d outside %d..%d", c.SlotSize, wire.HeaderLen+64, 1<<24)
	case c.Credits < 4 || c.Credits > 4096:
		return fmt.Errorf("mwrpc: credits %d outside 4..4096", c.Credits)
	case c.EagerThreshold < 0 || c.EagerThreshold > c.SlotSize-wire.HeaderLen:
		return fmt.Errorf("mwrpc: eager threshold %d outside 0..%d (slot size minus the header)", c.EagerThreshold, c.SlotSize-wire.HeaderLen)
	case c.MaxMessage <= 0 || c.MaxMessage > 1<<31-1:
		return fmt.Errorf("mwrpc: max message %d outside 1..%d", c.MaxMessage, 1<<31-1)
	case c.PeerTimeout < time.Second:
		return fmt.Errorf("mwrpc: peer timeout %v below 1s (TCP keepalive counts in seconds)", c.PeerTimeout)
	case c.SharedReceives < 0 || c.SharedReceives > 1<<20:
		return fmt.Errorf("mwrpc: shared receives %d outside 0..%d", c.SharedReceives, 1<<20)
	case c.MaxConns < 0 || c.MaxConnsPerHost < 0 || c.ConnRatePerHost < 0:
		return fmt.Errorf("mwrpc: max conns %d, max conns per host %d and conn rate per host %g must not be negative", c.MaxConns, c.MaxConnsPerHost, c.ConnRatePerHost)
	case c.StreamWindow < minStreamWindow || c.StreamWindow > maxStreamWindow:
		return fmt.Errorf("mwrpc: stream window %d outside %d..%d", c.StreamWindow, minStreamWindow, maxStreamWindow)
	case c.CQDepth < 0:
		return fmt.Errorf("mwrpc: CQ depth %d is negative", c.CQDepth)
	case c.Windows < 1 || c.Pollers < 1 || c.Handlers < 1:
		return fmt.Errorf("mwrpc: windows %d, pollers %d and handlers %d must be positive", c.Windows, c.Pollers, c.Handlers)
	}
	return nil
}
