package shm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mwrpc/mwrpc/internal/idle"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Conn is one shm connection, a net.Conn whose bytes go through two shared-memory rings.
// Reads are serialized with each other, and so are writes; a read and a write run at once.
//
// Lifetimes: the rings are mapped from the end of the handshake until Close, which waits
// for a read or write in progress (it wakes a sleeping one first); the doorbells are open
// for as long. The socket is the connection's until Close.
type Conn struct {
	cfg           Config
	sock          *net.UnixConn
	local, remote *Addr

	hsMu   sync.Mutex // held through the handshake
	hsDone bool
	hsErr  error
	hsOK   atomic.Bool // the handshake succeeded: reads and writes skip hsMu

	dmu      sync.Mutex // the deadlines and where they apply (the socket until the handshake ends)
	rdl, wdl time.Time

	rmu        sync.Mutex // a read in progress
	rspin      waitSpin
	rwatch     *watcher           // its polls, shared with the process's other readers (readers)
	peerCopy   atomic.Int64       // bytes the peer copies before it answers (PeerCopies), for the next read's wait
	copyLate   time.Duration      // how much later than its copy the peer's last answer came (copyLateFit; rmu)
	readSleep  func(uintptr) bool // flagThenCheck of rx's data waiter and readReady
	rx         *ring              // the ring this side created and reads
	rxMem      []byte
	rxBell     *bell // a reader sleeps here; the peer rings it after writing
	peerTxBell int   // the peer's writer sleeps there; rung after reading frees space

	wmu        sync.Mutex // a write in progress
	wspin      waitSpin
	writeSleep func(uintptr) bool // flagThenCheck of tx's space waiter and writeReady
	tx         *ring              // the peer's ring, which this side writes
	txMem      []byte
	txBell     *bell // a writer sleeps here; the peer rings it after reading
	peerRxBell int   // the peer's reader sleeps there; rung after writing

	shares      bool       // this side's shared memory may go to the peer (Config.sharesWith)
	shareMu     sync.Mutex // announced (regions_linux.go)
	announced   map[*verbs.Memory]*localRegion
	peerMu      sync.RWMutex // held (read) by a copy into peerRegions
	peerRegions []peerRegion // by id
	peerClosed  bool         // unmapped at Close

	doorbells atomic.Uint64 // Stats
	sleeps    atomic.Uint64

	closed    atomic.Bool
	peerGone  atomic.Bool
	broken    atomic.Pointer[error] // why the connection failed (a protocol error), sticky
	closeOnce sync.Once
	watching  chan struct{} // closed when the socket watcher has returned; nil before
}

var _ net.Conn = (*Conn)(nil)

func newConn(sock *net.UnixConn, cfg Config, local, remote *Addr, readers *pollGroup) *Conn {
	c := &Conn{cfg: cfg, sock: sock, local: local, remote: remote, shares: cfg.sharesWith(remote.UID, uint32(os.Geteuid())), rspin: readSpin(cfg), wspin: writeSpin(cfg), peerTxBell: -1, peerRxBell: -1}
	// Made once: a wait hands its check to the poller, which would allocate a closure
	// per sleep. The rings are read when a check runs, under rmu or wmu.
	c.readSleep = flagThenCheck(func() *atomic.Uint32 { return c.rx.dataWaiter }, c.readReady)
	c.rwatch = newWatcher(readers, c.readReady)
	c.writeSleep = flagThenCheck(func() *atomic.Uint32 { return c.tx.spaceWaiter }, c.writeReady)
	return c
}

// Dial connects to the shm listener at the Unix socket path, checks its credentials and
// sets the rings up, within ctx.
func Dial(ctx context.Context, path string, cfg Config) (*Conn, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("shm: dial %s: %w", path, err)
	}
	uc := nc.(*net.UnixConn)
	remote, err := checkPeer(uc, path, cfg)
	if err != nil {
		_ = uc.Close()
		return nil, err
	}
	c := newConn(uc, cfg, &Addr{Path: path}, remote, &dialedReaders)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	err = c.handshake()
	if !stop() || ctx.Err() != nil {
		err = fmt.Errorf("shm: dial %s: %w", path, ctx.Err())
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{}) // ctx bounded the setup, not the connection
	return c, nil
}

// checkPeer reads the peer's credentials from the kernel (SO_PEERCRED) and refuses a user
// the configuration does not allow.
func checkPeer(uc *net.UnixConn, path string, cfg Config) (*Addr, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("shm: %s: %w", path, err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("shm: %s: %w", path, err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("shm: %s: read the peer's credentials (SO_PEERCRED): %w", path, cerr)
	}
	a := &Addr{Path: path, PID: cred.Pid, UID: cred.Uid}
	if !uidAllowed(cfg, cred.Uid) {
		return a, fmt.Errorf("%w: %s: peer process %d runs as uid %d, allowed %v", ErrCredentials, path, cred.Pid, cred.Uid, allowedUIDs(cfg))
	}
	return a, nil
}

func allowedUIDs(cfg Config) []uint32 {
	if len(cfg.PeerUIDs) == 0 {
		return []uint32{uint32(os.Geteuid())}
	}
	return cfg.PeerUIDs
}

func uidAllowed(cfg Config, uid uint32) bool {
	for _, u := range allowedUIDs(cfg) {
		if u == uid {
			return true
		}
	}
	return false
}

// handshake runs the setup once: both hellos, the peer's ring mapped, the socket watched.
// Later calls return its result.
func (c *Conn) handshake() error {
	if c.hsOK.Load() {
		return nil
	}
	c.hsMu.Lock()
	defer c.hsMu.Unlock()
	if c.hsDone {
		return c.hsErr
	}
	c.hsDone = true
	if c.closed.Load() {
		c.hsErr = net.ErrClosed
		return c.hsErr
	}
	c.dmu.Lock()
	if c.rdl.IsZero() && c.wdl.IsZero() {
		_ = c.sock.SetDeadline(time.Now().Add(c.cfg.handshakeTimeout()))
	}
	c.dmu.Unlock()
	if err := c.exchangeHellos(); err != nil {
		c.hsErr = fmt.Errorf("shm: setup with %v: %w", c.remote, err)
		return c.hsErr
	}
	c.dmu.Lock()
	_ = c.sock.SetDeadline(time.Time{})
	_ = c.rxBell.f.SetReadDeadline(c.rdl)
	_ = c.txBell.f.SetReadDeadline(c.wdl)
	c.watching = make(chan struct{})
	c.dmu.Unlock()
	go c.watch()
	c.hsOK.Store(true)
	return nil
}

// exchangeHellos creates this side's ring and doorbells, sends them, and maps what the
// peer sent. What it made is installed on c as it goes, so that Close releases it.
func (c *Conn) exchangeHellos() error {
	size := c.cfg.ringSize()
	fd, mem, err := newRingFile(size)
	if err != nil {
		return err
	}
	defer unix.Close(fd) // the peer has its own descriptor once sent; the mapping stays
	c.rxMem, c.rx = mem, newRing(mem, size)
	if c.rxBell, err = newBell("shm-rx-bell"); err != nil {
		return err
	}
	if c.txBell, err = newBell("shm-tx-bell"); err != nil {
		return err
	}
	out := appendHello(make([]byte, 0, helloLen), size)
	if _, _, err := c.sock.WriteMsgUnix(out, unix.UnixRights(fd, c.rxBell.fd, c.txBell.fd), nil); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	in := make([]byte, helloLen+1) // one more: a longer message is refused, not cut
	oob := make([]byte, unix.CmsgSpace(4*(helloFDs+1)))
	n, oobn, flags, _, err := c.sock.ReadMsgUnix(in, oob)
	if err != nil {
		return fmt.Errorf("read the peer's hello: %w", err)
	}
	fds, err := takeFDs(oob[:oobn], flags)
	if err != nil {
		return err
	}
	defer closeFDs(fds) // those not kept are closed
	peerSize, err := parseHello(in[:n])
	if err != nil {
		return err
	}
	if len(fds) != helloFDs {
		return fmt.Errorf("hello carried %d descriptors, want %d: %w", len(fds), helloFDs, ErrProtocol)
	}
	for _, b := range fds[1:] {
		if err := checkPeerBell(b); err != nil {
			return err
		}
	}
	if c.txMem, err = mapPeerRing(fds[0], peerSize); err != nil {
		return err
	}
	c.tx = newRing(c.txMem, peerSize)
	c.peerRxBell, c.peerTxBell = fds[1], fds[2]
	fds[1], fds[2] = -1, -1 // kept
	return nil
}

// takeFDs returns the descriptors that came with a message. A truncated control message
// (more descriptors than there was room for: the kernel closed the rest) is refused.
func takeFDs(oob []byte, flags int) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("hello's control message: %v: %w", err, ErrProtocol)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("hello's control message: %v: %w", err, ErrProtocol)
		}
		fds = append(fds, got...)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		closeFDs(fds)
		return nil, fmt.Errorf("hello carried more descriptors than %d: %w", helloFDs, ErrProtocol)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

// watch handles the peer's control messages (control.go) until the socket's end: the peer
// closed the connection or its process died (the kernel closes its descriptors). Then
// sleepers are woken to see it. A control message that is not what it should be breaks the
// protocol.
func (c *Conn) watch() {
	defer close(c.watching)
	b := make([]byte, controlLen+1) // one more: a longer message is refused, not cut
	oob := make([]byte, unix.CmsgSpace(4*2))
	for {
		n, oobn, flags, _, err := c.sock.ReadMsgUnix(b, oob)
		if err != nil || n == 0 && oobn == 0 {
			break
		}
		if err := c.control(b[:n], oob[:oobn], flags); err != nil {
			c.fail(err)
			break
		}
	}
	c.peerGone.Store(true)
	c.rxBell.wake()
	c.txBell.wake()
}

// control takes a control message's descriptors and handles it; those it does not keep
// are closed.
func (c *Conn) control(b, oob []byte, flags int) error {
	fds, err := takeFDs(oob, flags)
	if err != nil {
		return err
	}
	defer closeFDs(fds)
	return c.onControl(b, fds)
}

// fail breaks the connection for err (the first error is kept): the peer is told by the
// socket's end, and this side's reads and writes return err from then on.
func (c *Conn) fail(err error) error {
	err = fmt.Errorf("shm: connection with %v: %w", c.remote, err)
	if c.broken.CompareAndSwap(nil, &err) {
		_ = c.sock.Close()
	}
	return *c.broken.Load()
}

func (c *Conn) sticky() error {
	if p := c.broken.Load(); p != nil {
		return *p
	}
	if c.closed.Load() {
		return net.ErrClosed
	}
	return nil
}

// Read reads what the peer wrote, at most len(p) bytes, waiting for the first. It returns
// io.EOF once the peer is gone and everything it wrote has been read.
func (c *Conn) Read(p []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if err := c.sticky(); err != nil {
			return 0, err
		}
		n, err := c.rx.read(p)
		if err != nil {
			return 0, c.fail(err)
		}
		if n > 0 || len(p) == 0 {
			if takeWaiter(c.rx.spaceWaiter) {
				c.ringPeer(c.peerTxBell)
			}
			return n, nil
		}
		if c.peerGone.Load() {
			if err := c.sticky(); err != nil {
				return 0, err // broken before the watcher said gone: the protocol error, not EOF
			}
			if avail, err := c.rx.readable(); err == nil && avail == 0 {
				return 0, io.EOF
			}
			continue
		}
		if err := c.await(&c.rspin, true, c.readReady, c.rxBell, c.readSleep, c.rx.dataWaiter); err != nil {
			return 0, err
		}
	}
}

func (c *Conn) readReady() bool {
	n, err := c.rx.readable()
	return n > 0 || err != nil || c.peerGone.Load() || c.closed.Load()
}

// Write writes all of p, waiting for room in the ring as needed.
func (c *Conn) Write(p []byte) (int, error) {
	v := net.Buffers{p}
	n, err := c.WriteBuffers(&v)
	return int(n), err
}

// WriteBuffers writes all of v's bytes, in order, waiting for room in the ring as Write
// does, and consumes v as net.Buffers.WriteTo does (soft.BuffersWriter). Each pass copies
// as much of the buffers as the ring takes and publishes it at once: a frame written as
// its header, padding and payload reaches the peer's reader whole, with at most one
// doorbell, where a Write of each would publish, and might ring, three times.
func (c *Conn) WriteBuffers(v *net.Buffers) (int64, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var total int64
	for {
		n, err := c.writeOnce(v)
		total += int64(n)
		if err != nil || len(*v) == 0 {
			return total, err
		}
		if n > 0 {
			continue
		}
		if err := c.await(&c.wspin, false, c.writeReady, c.txBell, c.writeSleep, c.tx.spaceWaiter); err != nil {
			return total, err
		}
	}
}

// writeOnce writes as much of v as the ring takes now, consuming it, and rings the peer's
// doorbell if its reader sleeps. wmu is held.
func (c *Conn) writeOnce(v *net.Buffers) (int, error) {
	if err := c.sticky(); err != nil {
		return 0, err
	}
	if c.peerGone.Load() {
		return 0, fmt.Errorf("shm: write to %v: the peer closed the connection: %w", c.remote, syscall.EPIPE)
	}
	n, err := c.tx.writeBuffers(v)
	if err != nil {
		return 0, c.fail(err)
	}
	if n > 0 && takeWaiter(c.tx.dataWaiter) {
		c.ringPeer(c.peerRxBell)
	}
	return n, nil
}

// TryWrite writes as much of p as the ring takes now and returns how much, without
// waiting: for room, or for a write in progress (then it writes nothing). A soft QP's
// stream reader sends its handler's responses through it (soft.TryWriter).
func (c *Conn) TryWrite(p []byte) (int, error) {
	v := net.Buffers{p}
	n, err := c.TryWriteBuffers(&v)
	return int(n), err
}

// TryWriteBuffers is TryWrite of v's bytes, in order: it copies as much of them as the
// ring takes now, publishes it at once and consumes it from v as net.Buffers.WriteTo does
// (soft.TryBuffersWriter). It writes nothing while another write is in progress.
func (c *Conn) TryWriteBuffers(v *net.Buffers) (int64, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	if !c.wmu.TryLock() {
		return 0, nil
	}
	defer c.wmu.Unlock()
	n, err := c.writeOnce(v)
	return int64(n), err
}

func (c *Conn) writeReady() bool {
	n, err := c.tx.writable()
	return n > 0 || err != nil || c.peerGone.Load() || c.closed.Load()
}

// ringPeer rings one of the peer's doorbells (fd), which its waiter flag asked for.
func (c *Conn) ringPeer(fd int) {
	c.doorbells.Add(1)
	ringBell(fd)
}

// Stats returns the connection's counts so far.
func (c *Conn) Stats() Stats {
	return Stats{Doorbells: c.doorbells.Load(), Sleeps: c.sleeps.Load(), Watched: c.rwatch.watchedN.Load()}
}

// flagThenCheck returns the check a sleeper runs before each sleep on its doorbell: set
// its waiter flag, then look at the ring (ready). The flag is set again before every
// check, not once per wait: a peer may load the flag of an earlier sleep and swap it only
// after this sleep set it again, so that this sleep's flag is gone and its wake-up finds
// nothing new; the peer's next entry must find the flag set again (TestWakeRearms). The
// order, flag then check, is the sleeper's half of ring.go's Dekker protocol; the peer
// stores its position, then takes the flag (takeWaiter).
func flagThenCheck(waiter func() *atomic.Uint32, ready func() bool) func(uintptr) bool {
	return func(uintptr) bool {
		waiter().Store(1)
		return ready()
	}
}

// await waits until ready: it polls for up to the budget of its direction's spinner for
// this wait (waitSpin.pick) and, reading, for as long again as the peer's copy takes when
// the peer makes one before it answers (takePeerCopy, asked before the spin and again
// when it ends, since a copy is often announced while it runs), then sleeps on the
// doorbell b until check (made by
// flagThenCheck from the direction's waiter flag and ready) reports ready, and clears the
// flag (awake, this side needs no doorbell); the spinner learns how the wait went. It
// returns the doorbell's error: a deadline, or the connection closed.
func (c *Conn) await(ws *waitSpin, reading bool, ready func() bool, b *bell, check func(uintptr) bool, waiter *atomic.Uint32) error {
	var start time.Time
	var copying time.Duration // the spin added for the peer's copy
	sp := ws.pick()
	if sp.Budget() > 0 {
		budget, announced := sp.Budget(), 0
		if reading {
			var n int
			copying, n = c.takePeerCopy()
			if announced = n; announced != 1 {
				copying = 0
			}
			if copying > 0 {
				budget = copying + max(budget, c.allowedLate())
			}
		}
		for {
			// The quiet spin stops when the process is no longer quiet.
			began, ok := c.poll(budget, sp.Max()+copying, sp == &ws.quiet, reading, ready)
			if start.IsZero() {
				start = began
			}
			if ok {
				sp.Won()
				c.fitCopyLate(copying, start)
				return nil
			}
			if !reading || copying > 0 {
				break
			}
			d, n := c.takePeerCopy() // a copy announced while it spun
			if announced += n; announced != 1 {
				break
			}
			budget, copying = d+c.allowedLate(), d
		}
	}
	c.sleeps.Add(1)
	err := b.wait(check)
	waiter.Store(0)
	if !start.IsZero() {
		sp.Lost(max(0, time.Since(start)-copying)) // the peer's copy is not its lateness
		if err == nil {
			c.fitCopyLate(copying, start)
		}
	}
	if err != nil && (c.closed.Load() || errors.Is(err, os.ErrClosed)) {
		return net.ErrClosed // the bell closed under a waiter: Close
	}
	return err
}

// fitCopyLate learns, after a wait for an answer behind an announced copy (copying
// greater than zero) that began at start and ended with data, how much later than the copy
// the answer came, for the next such wait (copyLate). The copy is not all the peer does
// before it answers: a caller that copies the large response out of registered memory
// into its own and its next large request in takes as long again as the copy it was
// announced for (one caller's 1 MiB call with the bytes API over shm on 2 cores: a
// 105 µs copy announced, the next request 200 µs later, past a 50 µs spin). A quarter
// more than was seen, at most maxCopySpin; an answer within the copy's time sets it to
// zero, and a wait past maxCopySpin beyond the copy (a caller gone idle) leaves it. rmu is
// held.
func (c *Conn) fitCopyLate(copying time.Duration, start time.Time) {
	if copying > 0 {
		c.copyLate = copyLateFit(c.copyLate, time.Since(start)-copying)
	}
}

// allowedLate is how long past an announced copy's time a reader polls for the answer:
// the lateness it learned (copyLate), while the process is quiet (idle.Quiet: cores
// nobody wants); else none. Where the cores are all busy the polling takes the CPU the
// peer answers with: on 2 cores (two processes), polling for a caller that copies its
// 1 MiB response out and its next request in cut one caller's p50 from 443 to 364 µs,
// but the polling took the core its copies and its collector needed, and it did 0.82x the
// calls (0.79x at 16 callers, whose calls are often alone on their connection while
// their callers copy). rmu is held.
func (c *Conn) allowedLate() time.Duration {
	if c.copyLate == 0 || !idle.Quiet() {
		return 0
	}
	return c.copyLate
}

// poll polls ready for up to budget (while the process is quiet, with quiet) and reports
// when it began and whether ready came: a reader in turn with the process's other readers
// (pollGroup; watched for up to watchFor), a writer on its own (a full ring's writer waits
// on one reader's copy).
func (c *Conn) poll(budget, watchFor time.Duration, quiet, reading bool, ready func() bool) (time.Time, bool) {
	if reading {
		return c.rwatch.wait(budget, watchFor, quiet)
	}
	// A clock read costs more than a poll: one per 64. The goroutine that will read may
	// be this process's: Poll yields between.
	return idle.Poll(budget, 64, quiet, ready)
}

// Close closes the connection: a read or write in progress returns net.ErrClosed, the
// peer sees the end, and the rings and doorbells are released once no read or write uses
// them. Only the first call does anything.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.rwatch.quit()
		_ = c.sock.Close() // the peer's watcher, and ours, see the end; a handshake stops
		c.hsMu.Lock()      // a handshake in progress has ended
		c.hsDone = true
		if c.hsErr == nil && c.watching == nil {
			c.hsErr = net.ErrClosed
		}
		c.hsMu.Unlock()
		if c.watching != nil {
			<-c.watching // it rings the doorbells after the socket's end: before they close
		}
		for _, b := range []*bell{c.rxBell, c.txBell} {
			if b != nil {
				b.wake() // a sleeping reader or writer wakes, sees closed
			}
		}
		c.rmu.Lock()
		c.wmu.Lock()
		c.release()
		c.wmu.Unlock()
		c.rmu.Unlock()
	})
	return nil
}

// release unmaps the rings and closes the doorbells; rmu and wmu are held.
func (c *Conn) release() {
	for _, m := range []*[]byte{&c.rxMem, &c.txMem} {
		if *m != nil {
			_ = unix.Munmap(*m)
			*m = nil
		}
	}
	c.rx, c.tx = nil, nil
	c.releasePeerRegions()
	for _, b := range []**bell{&c.rxBell, &c.txBell} {
		if *b != nil {
			(*b).close()
		}
	}
	closeFDs([]int{c.peerRxBell, c.peerTxBell})
	c.peerRxBell, c.peerTxBell = -1, -1
}

// LocalAddr returns the socket's path.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the socket's path with the peer's process and user.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline bounds reads (and a setup in progress), as on any net.Conn: a read
// waiting when it passes returns an error matching os.ErrDeadlineExceeded.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.rdl = t
	if c.watching == nil {
		return c.sock.SetReadDeadline(t)
	}
	return c.rxBell.f.SetReadDeadline(t)
}

// SetWriteDeadline bounds writes waiting for room in the ring (and a setup in progress).
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.wdl = t
	if c.watching == nil {
		return c.sock.SetWriteDeadline(t)
	}
	return c.txBell.f.SetReadDeadline(t)
}
