// Package shm is the same-host fabric of the verbs model: two processes on one host connect
// queue pairs of the soft provider through shared memory instead of a TCP socket.
//
// A connection is set up over a Unix-domain socket. Each side checks the other's
// credentials (SO_PEERCRED: the same user by default, Config.PeerUIDs for a named set), then
// creates the ring it will receive on in a sealed memfd and passes it, with two eventfd
// doorbells, over the socket (SCM_RIGHTS). From then on the stream's bytes go through the
// two rings (ring.go); the socket stays open only so that each side learns at once when the
// other closes or dies (the kernel closes a dead process's end).
//
// Dial and Listen return the connection as a net.Conn, which a soft device's queue pair
// takes as its wire (verbs.StreamQP, normally through cm.Connect): the memory regions, the
// windows and every check of a remote access (rkey, key8, PD, the QP a type-2 window is
// bound to, rights, window and region bounds) are the soft NIC's, executed by the side that
// owns the memory, so the rules are enforced where the memory lives, as a NIC enforces
// them. The rings replace the socket, and one thing more: registered memory mapped with
// verbs.MapOptions.Shared (the pool's slabs) is passed to a peer of the same user (Config
// says whom else), which maps it, so that a
// READ into it is placed: the owner of the source copies the bytes straight into the
// requester's destination, after its checks, and sends a completion without payload
// (regions_linux.go, soft.SharedMemoryWire); a WRITE, and a SEND of up to 16 KiB, from it
// are pulled the same way by the target. A READ into other memory, or into a mapping
// the peer has not mapped yet, is copied into the ring by its owner's engine and out of it
// by the requester's reader.
//
// # What a peer can do
//
// A peer maps the rings and can write anything into them at any time. Every position read
// from a ring is checked against the other (see ring), the stream's bytes are copied out
// before they are parsed, and a broken ring fails only its connection, with an error
// wrapping ErrProtocol (and so verbs.ErrPeerProtocol). A peer cannot shrink a ring's file
// under the mapping (the memfd is sealed against shrinking and growing, which the receiver
// checks), so it cannot make this side fault on a missing page. docs/security.md has the
// whole trust model.
//
// # Doorbells and idle cost
//
// A reader that finds its ring empty spins for at most Config.Spin, then sets its waiter
// flag and sleeps in the Go netpoller on its eventfd; the writer rings it only when the
// flag was set. The spin adapts: after a wait that ended within Config.Spin it spins up to
// twice that wait next time, so that a peer answering a call at a time is met polling
// rather than asleep; after a longer wait it halves, so a side whose peer answers slower
// than the spin (an idle connection, large messages, a busy machine) stops burning the
// CPU its peer may need; it doubles after a spin that found data. With Config.QuietSpin
// set, a reader spins for up to that instead while its process is quiet (idle.Quiet:
// cores to spare, few goroutines running), fitted to its waits: on an idle many-core
// machine a small call's answer then lands while the reader polls. An idle connection
// costs no CPU and no OS thread.
//
// A process's readers share their polling (pollgroup.go), as a NIC's completion queue is
// polled for many queue pairs: at most half of GOMAXPROCS of the readers of the
// connections it dialed poll at once, and as many of those it accepted (one each on 2
// cores); a reader that would be one more parks, watched: a polling reader looks at its
// ring between polls of its own and wakes it (a goroutine made ready, no system call, no
// doorbell from the peer) when its data comes, or sends it to sleep on its doorbell when
// its spin is over. A server that many client processes reach, or a Client with several
// lanes, so polls with a bounded number of cores, not one a connection.
//
// Linux only: elsewhere Dial and Listen fail with an error wrapping ErrUnsupported that
// names the system.
package shm

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Errors of the shm fabric. Match them with errors.Is.
var (
	// ErrProtocol is a peer that broke the shm protocol: a position outside the ring, a
	// hello, ring header or region announcement that is not what it should be, a file that
	// is not a sealed memfd of the size announced, a placed READ whose destination is
	// outside what the peer shared. It wraps verbs.ErrPeerProtocol, so a queue pair whose
	// stream failed so reports it as its fault.
	ErrProtocol = fmt.Errorf("shm: the peer broke the shm protocol: %w", verbs.ErrPeerProtocol)
	// ErrCredentials is a peer whose user is not allowed (Config.PeerUIDs).
	ErrCredentials = errors.New("shm: peer credentials refused")
	// ErrUnsupported is returned on systems without the fabric (all but Linux).
	ErrUnsupported = fmt.Errorf("shm: not supported on %s: %w", runtime.GOOS, verbs.ErrUnsupported)
)

// Scheme is the scheme of shm targets: shm:///path/to.sock names the Unix socket at
// /path/to.sock.
const Scheme = "shm://"

// Config tunes a side of the fabric. The zero value is ready.
type Config struct {
	// PeerUIDs are the users a peer may run as. Empty: only this process's effective
	// user. Both sides check: a server its clients, a client the server it reached.
	PeerUIDs []uint32
	// RingSize is the bytes of the ring this side receives on, a power of two within
	// [MinRingSize, MaxRingSize]. Zero: DefaultRingSize.
	RingSize int
	// Spin is the longest a reader or writer polls its ring before it sleeps on its
	// doorbell (each direction adapts its spin below it, see the package doc): a peer that
	// answers within it is met polling. A connection carrying calls at most Spin apart
	// keeps a core busy on each side between them; a lower Spin trades latency at one
	// caller for that CPU. Zero: DefaultSpin; negative: never spin.
	Spin time.Duration
	// QuietSpin is how long a reader polls its ring before sleeping while its process is
	// quiet (idle.Quiet: at least 4 Ps, few goroutines running or in system calls), in
	// place of Spin; its budget fits itself to the waits (idle.NewFitSpinner). Zero, the
	// default, spins no longer than Spin. The transport sets it from its Config.BusyPoll.
	// Measured with two processes on 16 cores (8 each), a 100 µs QuietSpin took 64 B at
	// one caller from 22.6 to 16.5 µs a call, and cost 6% of the calls at 16 callers and
	// 4% at 64 (3 pairs of runs).
	QuietSpin time.Duration
	// PrivateMemory keeps this side's registered memory to itself with every peer: no
	// mapping is passed to the peer, and READs into it and WRITEs from it go through the
	// ring (two copies). A shared mapping holds many buffers (a pool's slab serves every
	// connection), and a peer that maps it can read and write all of them at any time.
	// By default memory is shared only with a peer running as this process's own
	// effective user (see ShareWithOtherUsers). The peer's own choice is unaffected.
	PrivateMemory bool
	// ShareWithOtherUsers also shares registered memory with a peer admitted through
	// PeerUIDs that runs as another user, which can then read and write every buffer of
	// each slab it is handed, other connections' included. Off by default: with such a
	// peer READs and WRITEs go through the ring.
	ShareWithOtherUsers bool
	// HandshakeTimeout bounds a connection's setup when the caller set no deadline
	// (Listener.Accept's connections, whose setup runs on their first Read or Write).
	// Zero: 10 s.
	HandshakeTimeout time.Duration
}

// DefaultRingSize is the ring a side receives on unless Config.RingSize says otherwise: room
// for a 1 MiB READ response with its frame, so that the writer rarely waits for the reader.
const DefaultRingSize = 2 << 20

// DefaultSpin is how long a side polls before sleeping unless Config.Spin says otherwise:
// longer than a round trip through a peer that sleeps between calls (a wake-up on each
// side, 30-60 µs on the 2-core development VM), so that a reader's fitting spin can
// catch the next one and both sides leave sleeping for good; far shorter than an idle
// connection's gaps. Measured with two processes on 2 cores, 64 B at one caller: 57.5 µs
// p50 with 20 µs (which halved to the floor and slept), 3.4 µs with 50 µs; at 16 and 64
// callers 0.82-1.64x the calls, the losses where the two processes share both cores
// (docs/performance.md).
const DefaultSpin = 50 * time.Microsecond

func (c Config) ringSize() int {
	if c.RingSize == 0 {
		return DefaultRingSize
	}
	return c.RingSize
}

func (c Config) spin() time.Duration {
	switch {
	case c.Spin == 0:
		return DefaultSpin
	case c.Spin < 0:
		return 0
	}
	return c.Spin
}

func (c Config) handshakeTimeout() time.Duration {
	if c.HandshakeTimeout <= 0 {
		return 10 * time.Second
	}
	return c.HandshakeTimeout
}

// sharesWith reports whether this side shares registered memory with a peer running as
// uid, this process running as self.
func (c Config) sharesWith(uid, self uint32) bool {
	return !c.PrivateMemory && (uid == self || c.ShareWithOtherUsers)
}

func (c Config) check() error {
	if n := c.ringSize(); !validRingSize(n) {
		return fmt.Errorf("shm: ring size %d is not a power of two within [%d, %d]: %w", n, MinRingSize, MaxRingSize, verbs.ErrInvalid)
	}
	return nil
}

// Addr is an end of an shm connection: the socket's path and, for the peer, the process and
// user the kernel reported for it.
type Addr struct {
	Path string
	PID  int32 // 0 for this side's own address
	UID  uint32
}

// Network returns "shm".
func (a *Addr) Network() string { return "shm" }

// String returns the target form, with the peer's process when known:
// "shm:///run/kv.sock" or "shm:///run/kv.sock#pid=1234".
func (a *Addr) String() string {
	if a.PID == 0 {
		return Scheme + a.Path
	}
	return fmt.Sprintf("%s%s#pid=%d", Scheme, a.Path, a.PID)
}

// ParseTarget returns the socket path of an shm target ("shm:///path/to.sock"), and false
// when target is not one.
func ParseTarget(target string) (string, bool) {
	if len(target) <= len(Scheme) || target[:len(Scheme)] != Scheme {
		return "", false
	}
	p := target[len(Scheme):]
	if p[0] != '/' {
		return "", false // shm://host/... names no host: only shm:///absolute/path
	}
	return p, true
}

// Stats counts a connection's doorbell traffic since it was set up, both directions
// together: what each entry through the rings cost beyond the copy.
type Stats struct {
	// Doorbells is how many times this side rang the peer's doorbells (an eventfd write,
	// a system call, and a wake-up of the peer's thread): only for a peer that had set its
	// waiter flag, so none while the peer polls, however many entries cross.
	Doorbells uint64
	// Sleeps is how many times this side's reader or writer, having polled for its spin,
	// went to sleep on its doorbell.
	Sleeps uint64
	// Watched is how many of this side's reads waited watched: parked while another
	// reader of the process polled, its ring among theirs (at most half of GOMAXPROCS
	// readers of a process poll at once, one on 2 cores).
	Watched uint64
}
