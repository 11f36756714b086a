package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/idle"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"golang.org/x/sys/unix"
)

// connPair sets up a connection through a listener of its own; the server's end has run
// its setup. Both ends are closed at cleanup.
func connPair(t testing.TB, ccfg, scfg Config) (client, server *Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := Listen(path, scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ach := make(chan *Conn, 1)
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		ach <- c.(*Conn)
		errc <- c.(*Conn).handshake()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, err = Dial(ctx, path, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server = <-ach
	t.Cleanup(func() { server.Close() })
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return client, server
}

// TestConnStream: 8 MiB each way at once through 64 KiB rings arrive intact, in writes and
// reads of random sizes, with and without spinning.
func TestConnStream(t *testing.T) {
	for _, spin := range []time.Duration{-1, 0} {
		t.Run("spin="+spin.String(), func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			cfg := Config{RingSize: 64 << 10, Spin: spin}
			a, b := connPair(t, cfg, cfg)
			const n = 8 << 20
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(i * 7 / 5)
			}
			errc := make(chan error, 2)
			pump := func(w *Conn, seed uint64) {
				r := rand.New(rand.NewPCG(seed, 1))
				for off := 0; off < n; {
					k := min(n-off, 1+r.IntN(200<<10))
					if _, err := w.Write(src[off : off+k]); err != nil {
						errc <- err
						return
					}
					off += k
				}
				errc <- nil
			}
			check := func(rd *Conn) error {
				got := make([]byte, 0, n)
				buf := make([]byte, 100<<10)
				for len(got) < n {
					k, err := rd.Read(buf[:1+rand.IntN(len(buf))])
					if err != nil {
						return err
					}
					got = append(got, buf[:k]...)
				}
				if !bytes.Equal(got, src) {
					return errors.New("bytes differ")
				}
				return nil
			}
			go pump(a, 1)
			go pump(b, 2)
			if err := check(b); err != nil {
				t.Fatalf("a -> b: %v", err)
			}
			if err := check(a); err != nil {
				t.Fatalf("b -> a: %v", err)
			}
			for range 2 {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestConnDeadlines: a read or a write on a full ring waits until its deadline and fails
// with os.ErrDeadlineExceeded; a deadline moved into the past wakes one waiting.
func TestConnDeadlines(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{RingSize: MinRingSize}, Config{RingSize: MinRingSize})
	_ = b.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	if _, err := b.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
	if d := time.Since(start); d < 25*time.Millisecond {
		t.Fatalf("read gave up after %v, before its deadline", d)
	}
	_ = b.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { _, err := b.Read(make([]byte, 10)); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	_ = b.SetReadDeadline(time.Unix(1, 0))
	if err := <-errc; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read woken by a past deadline: %v", err)
	}
	_ = a.SetWriteDeadline(time.Now().Add(30 * time.Millisecond))
	n, err := a.Write(make([]byte, 3*MinRingSize)) // b does not read: the ring fills
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != MinRingSize {
		t.Fatalf("write to a full ring: %d bytes, %v; want %d and a deadline error", n, err, MinRingSize)
	}
}

// TestConnEnds: Close wakes a waiting read with net.ErrClosed; the peer reads what was
// written before the close, then io.EOF, and its writes fail with EPIPE.
func TestConnEnds(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{}, Config{})
	errc := make(chan error, 1)
	go func() { _, err := a.Read(make([]byte, 10)); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	if _, err := a.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read across Close: %v, want net.ErrClosed", err)
	}
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "last words" {
		t.Fatalf("peer read %q, %v; want the last words, then EOF", got, err)
	}
	if _, err := b.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write to a closed peer: %v, want EPIPE", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
}

// TestCredentials: a listener that allows only another user turns the dialer away (and
// counts it); a dialer that allows only another user refuses the server with
// ErrCredentials. Nothing leaks on either side.
func TestCredentials(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	other := []uint32{uint32(os.Geteuid()) + 1}
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := Listen(path, Config{PeerUIDs: other})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := ln.Accept(); err == nil { // only the allowed one, which never comes
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := Dial(ctx, path, Config{}); err == nil {
		c.Close()
		t.Fatal("a refused client's dial succeeded")
	} else if !strings.Contains(err.Error(), "hello") {
		t.Fatalf("refused dial: %v, want the peer's hello missing", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ln.Refused() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("listener refused %d, want 1", ln.Refused())
		}
	}
	ln.Close()
	<-done

	ln2, err := Listen(path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	go func() {
		if c, err := ln2.Accept(); err == nil {
			_, _ = c.Read(nil) // the setup fails: the dialer left
			c.Close()
		}
	}()
	_, err = Dial(ctx, path, Config{PeerUIDs: other})
	if !errors.Is(err, ErrCredentials) {
		t.Fatalf("dial refusing the server's user: %v, want ErrCredentials", err)
	}
}

// TestHostileRing: a peer that publishes a position outside the ring fails the connection
// with ErrProtocol (and so verbs.ErrPeerProtocol) at the side that reads it; the peer sees
// the connection end. Other connections go on.
func TestHostileRing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		poke   func(attacker *Conn)
		victim func(v *Conn) error
	}{
		{"tail far ahead", func(x *Conn) { x.tx.tail.Store(x.tx.pos + x.tx.size + 1) }, func(v *Conn) error { _, err := v.Read(make([]byte, 8)); return err }},
		{"tail behind head", func(x *Conn) { x.tx.tail.Store(^uint64(0)) }, func(v *Conn) error { _, err := v.Read(make([]byte, 8)); return err }},
		{"head ahead of tail", func(x *Conn) { x.rx.head.Store(x.rx.pos + 5) }, func(v *Conn) error { _, err := v.Write(make([]byte, 8)); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			attacker, victim := connPair(t, Config{}, Config{})
			ok1, ok2 := connPair(t, Config{}, Config{})
			tc.poke(attacker)
			// A write publishes a tail of its own: poke again after the attacker's pos moves.
			err := tc.victim(victim)
			if !errors.Is(err, ErrProtocol) || !errors.Is(err, verbs.ErrPeerProtocol) {
				t.Fatalf("victim: %v, want ErrProtocol", err)
			}
			if _, err := victim.Read(make([]byte, 1)); !errors.Is(err, ErrProtocol) {
				t.Fatalf("the failure is not sticky: %v", err)
			}
			othersGoOn(t, attacker, ok1, ok2)
		})
	}
}

// rawClient dials path and returns the socket, to speak for a hostile client.
// othersGoOn checks what a failed connection leaves: its attacking end reads EOF once the
// victim gave up, and another connection (ok1 to ok2) still carries bytes.
func othersGoOn(t *testing.T, attacker, ok1, ok2 *Conn) {
	t.Helper()
	attacker.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := attacker.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("attacker's read after the victim failed: %v, want EOF", err)
	}
	if _, err := ok1.Write([]byte("still")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(ok2, b); err != nil || string(b) != "still" {
		t.Fatalf("another connection: %q %v", b, err)
	}
}

func rawClient(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestHostileHello: a client whose hello or descriptors are not what the protocol says
// fails its own setup with ErrProtocol, naming what was wrong; the descriptors it sent are
// closed and the listener serves the next client.
func TestHostileHello(t *testing.T) {
	memfd := func(t *testing.T, size int, seal bool) int {
		fd, err := unix.MemfdCreate("hostile", unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Ftruncate(fd, int64(ringFileSize(size)))
		if seal {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, ringSeals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	goodRing := func(t *testing.T) int {
		fd, mem, err := newRingFile(MinRingSize)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Munmap(mem)
		return fd
	}
	eventfd := func(t *testing.T) int {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	pipeFD := func(t *testing.T) int {
		var p [2]int
		if err := unix.Pipe(p[:]); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[0])
		return p[1]
	}
	hello := appendHello(nil, MinRingSize)
	for _, tc := range []struct {
		name string
		msg  []byte
		fds  func(t *testing.T) []int
		want string
	}{
		{"bad magic", append([]byte("XXXXXXXX"), hello[8:]...), func(t *testing.T) []int { return []int{goodRing(t), eventfd(t), eventfd(t)} }, "magic"},
		{"short", hello[:10], func(t *testing.T) []int { return []int{goodRing(t), eventfd(t), eventfd(t)} }, "hello of 10 bytes"},
		{"long", append(append([]byte{}, hello...), 0), func(t *testing.T) []int { return []int{goodRing(t), eventfd(t), eventfd(t)} }, "hello of 17 bytes"},
		{"huge ring", append(append([]byte{}, hello[:12]...), 30, 0, 0, 0), func(t *testing.T) []int { return []int{goodRing(t), eventfd(t), eventfd(t)} }, "ring of 1<<30"},
		{"no descriptors", hello, func(t *testing.T) []int { return nil }, "0 descriptors"},
		{"two descriptors", hello, func(t *testing.T) []int { return []int{goodRing(t), eventfd(t)} }, "2 descriptors"},
		{"too many descriptors", hello, func(t *testing.T) []int {
			return []int{goodRing(t), eventfd(t), eventfd(t), eventfd(t), eventfd(t), eventfd(t)}
		}, "more descriptors"},
		{"unsealed memfd", hello, func(t *testing.T) []int { return []int{memfd(t, MinRingSize, false), eventfd(t), eventfd(t)} }, "seals"},
		{"wrong size", hello, func(t *testing.T) []int { return []int{memfd(t, 2*MinRingSize, true), eventfd(t), eventfd(t)} }, "bytes, its hello says"},
		{"no header", hello, func(t *testing.T) []int { return []int{memfd(t, MinRingSize, true), eventfd(t), eventfd(t)} }, "ring magic"},
		{"pipe for a memfd", hello, func(t *testing.T) []int { return []int{pipeFD(t), eventfd(t), eventfd(t)} }, "not a memfd"},
		{"pipe for a doorbell", hello, func(t *testing.T) []int { return []int{goodRing(t), pipeFD(t), eventfd(t)} }, "not an eventfd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			path := filepath.Join(t.TempDir(), "s.sock")
			ln, err := Listen(path, Config{RingSize: MinRingSize})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			raw := rawClient(t, path)
			fds := tc.fds(t)
			var oob []byte
			if len(fds) > 0 {
				oob = unix.UnixRights(fds...)
			}
			if _, _, err := raw.WriteMsgUnix(tc.msg, oob, nil); err != nil {
				t.Fatal(err)
			}
			closeFDs(fds)
			c, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Read(make([]byte, 1))
			if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("setup: %v, want ErrProtocol saying %q", err, tc.want)
			}
			c.Close()
			raw.Close()
			a, b := connPair(t, Config{}, Config{}) // the fabric goes on
			if _, err := a.Write([]byte("ok")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(b, make([]byte, 2)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTargets: shm targets parse to their socket path; other forms are not shm targets.
func TestTargets(t *testing.T) {
	for _, tc := range []struct {
		in   string
		path string
		ok   bool
	}{
		{"shm:///run/kv.sock", "/run/kv.sock", true},
		{"shm://host/run/kv.sock", "", false},
		{"shm://", "", false},
		{"127.0.0.1:80", "", false},
		{"dns:///x:1", "", false},
	} {
		p, ok := ParseTarget(tc.in)
		if p != tc.path || ok != tc.ok {
			t.Errorf("ParseTarget(%q) = %q, %v; want %q, %v", tc.in, p, ok, tc.path, tc.ok)
		}
	}
	a := &Addr{Path: "/run/kv.sock", PID: 42}
	if s := a.String(); s != "shm:///run/kv.sock#pid=42" {
		t.Errorf("Addr.String() = %q", s)
	}
}

// TestTryWrite: TryWrite takes what fits in the ring and returns at once, never waiting
// for room or for a write in progress; the peer reads exactly what it took.
func TestTryWrite(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{RingSize: MinRingSize}, Config{RingSize: MinRingSize})
	n, err := a.TryWrite(make([]byte, MinRingSize+100))
	if err != nil || n != MinRingSize {
		t.Fatalf("TryWrite into an empty ring: %d, %v; want %d", n, err, MinRingSize)
	}
	if n, err := a.TryWrite([]byte("x")); n != 0 || err != nil {
		t.Fatalf("TryWrite into a full ring: %d, %v; want 0 at once", n, err)
	}
	if _, err := io.ReadFull(b, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	a.wmu.Lock() // a write in progress
	n, err = a.TryWrite([]byte("x"))
	a.wmu.Unlock()
	if n != 0 || err != nil {
		t.Fatalf("TryWrite beside a write in progress: %d, %v; want 0", n, err)
	}
	if n, err := a.TryWrite(make([]byte, 200)); n != 100 || err != nil {
		t.Fatalf("TryWrite with 100 bytes of room: %d, %v", n, err)
	}
}

// TestIdleCostsNothing: readers waiting on an idle connection sleep on their doorbells
// after the spin: the process uses (almost) no CPU while they wait.
func TestIdleCostsNothing(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{}, Config{})
	done := make(chan error, 2)
	for _, c := range []*Conn{a, b} {
		go func() { _, err := c.Read(make([]byte, 1)); done <- err }()
	}
	time.Sleep(50 * time.Millisecond) // past the spin
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	time.Sleep(300 * time.Millisecond)
	used := cpu() - before
	if used > 30*time.Millisecond {
		t.Errorf("the process used %v of CPU in 300ms with two readers waiting on idle rings", used)
	}
	t.Logf("CPU used in 300ms idle: %v", used)
	a.Close()
	b.Close()
	for range 2 {
		<-done
	}
}

// pingPong sends rounds one-byte messages from a to b and back, each side waiting for the
// other's before it answers, and fails t if one does not arrive within the deadline (a
// reader left asleep: a lost wake-up) or arrives changed.
func pingPong(t *testing.T, a, b *Conn, rounds int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // a bound for a reader left asleep, far past a loaded CI's pace
	for _, c := range []*Conn{a, b} {
		if err := c.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
	}
	echoErr := make(chan error, 1)
	go func() {
		var m [1]byte
		for i := range rounds {
			if _, err := io.ReadFull(b, m[:]); err != nil {
				echoErr <- fmt.Errorf("echo side, round %d: %w", i, err)
				return
			}
			if _, err := b.Write(m[:]); err != nil {
				echoErr <- err
				return
			}
		}
		echoErr <- nil
	}()
	var m [1]byte
	for i := range rounds {
		if _, err := a.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(a, m[:]); err != nil {
			t.Fatalf("round %d of %d: %v (a lost wake-up leaves a reader asleep until the deadline)", i, rounds, err)
		}
		if m[0] != byte(i) {
			t.Fatalf("round %d: got %d back", i, m[0])
		}
	}
	if err := <-echoErr; err != nil {
		t.Fatal(err)
	}
}

// TestNoLostWakeup: with no spin, every read that finds its ring empty publishes that it
// sleeps and sleeps, and every write races with it: the writer's store of its position
// against the reader's store of its flag. Thousands of round trips, each a sleep and a
// wake-up on both sides, all arrive: a lost wake-up leaves a reader asleep until the
// deadline. The race between the two stores is narrow, so one run may miss a wrong order
// (TestFlagBeforeCheck catches the sleeper's every time): after a change to the protocol
// run it many times, as go test -race -count=50 -run 'Wakeup|Waiter|FlagBefore|Doorbell'.
func TestNoLostWakeup(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	cfg := Config{Spin: -1}
	a, b := connPair(t, cfg, cfg)
	rounds := 10000
	if raceEnabled {
		rounds = 3000
	}
	pingPong(t, a, b, rounds)
}

// TestFlagBeforeCheck: a write that lands just after the sleeper's last look at the ring
// still wakes it. The sleeper's check is slowed after it loads the producer's position,
// and the producer writes in that gap, every time: with the flag set before the check,
// the producer sees it and rings; were the flag set after the check, the producer would
// find none, ring nothing, and the sleeper would sleep until its deadline.
func TestFlagBeforeCheck(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{Spin: -1}, Config{Spin: -1})
	sp := readSpin(Config{Spin: -1})
	for i := range 20 {
		gap := make(chan struct{})
		wrote := make(chan error, 1)
		go func() {
			<-gap
			_, err := a.Write([]byte{byte(i)})
			wrote <- err
		}()
		checks := 0
		slowReady := func() bool {
			ready := b.readReady()
			if checks++; checks == 1 {
				close(gap)
				if err := <-wrote; err != nil {
					t.Error(err)
				}
			}
			return ready
		}
		if err := b.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
			t.Fatal(err)
		}
		b.rmu.Lock()
		check := flagThenCheck(func() *atomic.Uint32 { return b.rx.dataWaiter }, slowReady)
		err := b.await(&sp, false, slowReady, b.rxBell, check, b.rx.dataWaiter)
		b.rmu.Unlock()
		if err != nil {
			t.Fatalf("round %d: the sleeper was not woken by a write after its check: %v", i, err)
		}
		var m [1]byte
		if _, err := io.ReadFull(b, m[:]); err != nil || m[0] != byte(i) {
			t.Fatalf("round %d: read %d, %v", i, m[0], err)
		}
	}
}

// TestWakeRearms: a wake-up that finds nothing new (the peer took the flag this sleep set
// while it was about an earlier entry, and rang) leaves the sleeper's flag set again
// before it sleeps on, so that the peer's next entry rings. A sleeper that set its flag
// once per wait would sleep through that entry until its deadline.
func TestWakeRearms(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{Spin: -1}, Config{Spin: -1})
	for i := range 20 {
		got := make(chan error, 1)
		go func() {
			_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
			var m [1]byte
			_, err := io.ReadFull(b, m[:])
			if err == nil && m[0] != byte(i) {
				err = fmt.Errorf("read %d", m[0])
			}
			got <- err
		}()
		waitFlag(t, a.tx.dataWaiter)      // b sleeps
		if a.tx.dataWaiter.Swap(0) != 0 { // a late taker: the flag, a ring, no entry
			ringBell(a.peerRxBell)
		}
		waitFlag(t, a.tx.dataWaiter) // set again before b sleeps on
		if _, err := a.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("round %d: the sleeper missed the entry after a spurious wake-up: %v", i, err)
		}
	}
}

// waitFlag waits until a waiter flag is set, or fails t after 2 s.
func waitFlag(t *testing.T, f *atomic.Uint32) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); f.Load() == 0; time.Sleep(50 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reader set no waiter flag within 2 s")
		}
	}
}

// TestDoorbellOnlyForSleepers: entries written while the peer polls ring no doorbell:
// 1000 writes to a reader with a 10 s spin, which finds each before its spin ends, cost no
// system call on either side. With no spin, each of a ping-pong's messages finds its
// reader asleep: a doorbell each, and no more.
func TestDoorbellOnlyForSleepers(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	a, b := connPair(t, Config{Spin: 10 * time.Second}, Config{Spin: 10 * time.Second})
	const n = 1000
	got := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(b, make([]byte, n))
		got <- err
	}()
	for i := range n {
		if _, err := a.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if sa, sb := a.Stats(), b.Stats(); sa.Doorbells != 0 || sb.Sleeps != 0 {
		t.Errorf("%d writes to a polling reader: writer %+v, reader %+v; want no doorbell, no sleep", n, sa, sb)
	}

	c, d := connPair(t, Config{Spin: -1}, Config{Spin: -1})
	const rounds = 500
	pingPong(t, c, d, rounds)
	for _, side := range []*Conn{c, d} {
		if st := side.Stats(); st.Doorbells == 0 || st.Doorbells > rounds+1 {
			t.Errorf("%d no-spin round trips: %+v; want a doorbell per message at most, and some", rounds, st)
		}
	}
}

// TestWriteBuffersWhole: a frame written as its pieces with WriteBuffers reaches a
// sleeping reader whole, with one doorbell, where a Write of each piece rings it for each;
// one larger than the ring waits for room and arrives in order; TryWriteBuffers takes what
// fits now and leaves the rest in v.
func TestWriteBuffersWhole(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	const ringSize = 16 << 10
	a, b := connPair(t, Config{Spin: -1, RingSize: ringSize}, Config{Spin: -1, RingSize: ringSize})
	frame := func(i int) [][]byte {
		return [][]byte{bytes.Repeat([]byte{byte(i)}, 36), make([]byte, 128), bytes.Repeat([]byte{byte(i + 1)}, 4000)}
	}
	const rounds = 50
	for i := range rounds {
		want := bytes.Join(frame(i), nil)
		got := make(chan []byte, 1)
		go func() {
			buf := make([]byte, len(want)+100)
			n, _ := b.Read(buf) // one read: what the first publication brought
			got <- buf[:n]
		}()
		waitSleeping(t, b)
		v := net.Buffers(frame(i))
		if n, err := a.WriteBuffers(&v); err != nil || n != int64(len(want)) || len(v) != 0 {
			t.Fatalf("WriteBuffers: %d, %v, %d left", n, err, len(v))
		}
		if g := <-got; !bytes.Equal(g, want) {
			t.Fatalf("round %d: the first read brought %d bytes of the %d-byte frame", i, len(g), len(want))
		}
	}
	if d := a.Stats().Doorbells; d != rounds {
		t.Errorf("%d frames to a sleeping reader: %d doorbells, want one each", rounds, d)
	}

	big := bytes.Repeat([]byte("0123456789abcdef"), 3*ringSize/16)
	done := make(chan error, 1)
	go func() {
		v := net.Buffers{big[:100], big[100 : 2*ringSize], big[2*ringSize:]}
		_, err := a.WriteBuffers(&v)
		done <- err
	}()
	got := make([]byte, len(big))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !bytes.Equal(got, big) {
		t.Fatalf("a frame three rings long: %v, equal %v", err, bytes.Equal(got, big))
	}

	v := net.Buffers{make([]byte, ringSize-100), make([]byte, 300)}
	if n, err := a.TryWriteBuffers(&v); n != ringSize || err != nil || len(v) != 1 || len(v[0]) != 200 {
		t.Fatalf("TryWriteBuffers into an empty ring: %d, %v, %d left; want %d written, 200 bytes left", n, err, len(v), ringSize)
	}
	if n, err := a.TryWriteBuffers(&v); n != 0 || err != nil {
		t.Fatalf("TryWriteBuffers into a full ring: %d, %v; want 0 at once", n, err)
	}
}

// waitSleeping waits until c's reader sleeps on its doorbell (its waiter flag is set).
func waitSleeping(t *testing.T, c *Conn) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.rx.dataWaiter.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the reader never slept")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestLyingWaiterFlags: a peer that sets the waiter flags it should only take costs
// doorbell writes and spurious wake-ups, never a byte: round trips with no spin arrive
// whole and in order while a third party keeps setting every flag of both rings. (A peer
// that clears a sleeper's flag instead of ringing only leaves that sleeper waiting, as a
// peer that stops writing does; the positions, checked on every access, still say what is
// in the ring.)
func TestLyingWaiterFlags(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	cfg := Config{Spin: -1, RingSize: MinRingSize}
	a, b := connPair(t, cfg, cfg)
	stop := make(chan struct{})
	liar := make(chan struct{})
	go func() {
		defer close(liar)
		flags := []*atomic.Uint32{a.rx.dataWaiter, a.rx.spaceWaiter, b.rx.dataWaiter, b.rx.spaceWaiter}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			flags[i%len(flags)].Store(1)
			if i%16 == 0 {
				time.Sleep(5 * time.Microsecond)
			}
		}
	}()
	defer func() { close(stop); <-liar }()
	pingPong(t, a, b, 3000)
}

// TestFullDoorbellCloses: a peer holds this side's doorbells and may fill an eventfd's
// counter (0xfffffffffffffffe: a write to it then fails, and wakes nobody). A reader and
// a writer asleep on those doorbells still wake when the connection closes, and Close
// returns: this side's own rings of its doorbells empty a full counter first.
func TestFullDoorbellCloses(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	cfg := Config{Spin: -1, RingSize: MinRingSize}
	a, _ := connPair(t, cfg, cfg)
	full := binary.NativeEndian.AppendUint64(nil, 0xfffffffffffffffe)
	for _, fd := range []int{a.rxBell.fd, a.txBell.fd} {
		if _, err := unix.Write(fd, full); err != nil {
			t.Fatal(err)
		}
	}
	errc := make(chan error, 2)
	go func() { _, err := a.Read(make([]byte, 1)); errc <- err }()
	go func() { _, err := a.Write(make([]byte, 2*MinRingSize)); errc <- err }() // fills the ring, sleeps
	waitFlag(t, a.rx.dataWaiter)
	waitFlag(t, a.tx.spaceWaiter)
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5 s with the doorbells' counters full")
	}
	for range 2 {
		if err := <-errc; !errors.Is(err, net.ErrClosed) {
			t.Errorf("a sleeper woke with %v, want net.ErrClosed", err)
		}
	}
}

// TestReadSpinCoversPeerCopy: a reader whose peer copies a large message before it answers
// (PeerCopies, once since the last wait) polls for as long as the copy takes, and meets an
// answer that comes after its spin but within the copy's time; with no copy announced, or
// two (a loaded connection, where polling longer would take the peer's CPU), it sleeps as
// before.
func TestReadSpinCoversPeerCopy(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	cfg := Config{Spin: 20 * time.Microsecond}
	a, b := connPair(t, cfg, cfg)
	read := func(t *testing.T, i int) {
		t.Helper()
		_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
		var m [1]byte
		if _, err := io.ReadFull(b, m[:]); err != nil || m[0] != byte(i) {
			t.Fatalf("read %d, %v", m[0], err)
		}
	}
	for _, tc := range []struct {
		name   string
		copies int
		sleeps bool
	}{
		{"no copy", 0, true},
		{"one copy", 1, false},
		{"two copies", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The answer comes 300 µs after the read begins: past the 20 µs spin, well
			// within a 16 MiB copy's (maxCopySpin, 2 ms). A run that polled through it
			// once shows the copy's spin; a few tries keep a descheduled writer on a
			// loaded machine from failing it.
			for try := range 5 {
				i := try + 1
				for range tc.copies {
					b.PeerCopies(16 << 20)
				}
				before := b.sleeps.Load()
				go func() {
					if tc.sleeps { // until the reader sleeps (the read's deadline ends a wait too long)
						for end := time.Now().Add(2 * time.Second); a.tx.dataWaiter.Load() == 0 && time.Now().Before(end); {
							time.Sleep(50 * time.Microsecond)
						}
					} else {
						time.Sleep(300 * time.Microsecond)
					}
					_, _ = a.Write([]byte{byte(i)})
				}()
				read(t, i)
				slept := b.sleeps.Load() != before
				if slept == tc.sleeps {
					return
				}
				if tc.sleeps {
					t.Fatalf("the reader polled until the answer with %d copies announced", tc.copies)
				}
			}
			t.Fatalf("the reader slept through a wait its peer's copy covered, in 5 tries")
		})
	}
}

// TestReadSpinLearnsPeerLateness: a reader whose peer answered later than its announced
// copy took (a caller copying its response out and its next request in) polls that much
// longer behind the next announced copy while its process is quiet, and meets the answer;
// an answer within the copy's time forgets it. A process that is not quiet learns it too,
// but polls no longer: it sleeps again.
func TestReadSpinLearnsPeerLateness(t *testing.T) {
	leakcheck.Check(t)
	leakcheck.CheckHeld(t)
	cfg := Config{Spin: 20 * time.Microsecond}
	a, b := connPair(t, cfg, cfg)
	const copyBytes = 2_000_000 // 200 µs at copyRate
	i := 0
	// answer announces a copy, has the peer answer after d, reads the answer and reports
	// whether the reader slept.
	answer := func(t *testing.T, d time.Duration) bool {
		t.Helper()
		i++
		b.PeerCopies(copyBytes)
		before := b.sleeps.Load()
		go func(i int) {
			time.Sleep(d)
			_, _ = a.Write([]byte{byte(i)})
		}(i)
		_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
		var m [1]byte
		if _, err := io.ReadFull(b, m[:]); err != nil || m[0] != byte(i) {
			t.Fatalf("read %d, %v", m[0], err)
		}
		return b.sleeps.Load() != before
	}
	// learn has the peer answer 1 ms behind a 200 µs copy, and reports whether the reader
	// slept, with nothing learned, and learned that lateness (a writer later than
	// maxCopySpin past the copy teaches nothing). A reader descheduled through its poll
	// meets the answer without sleeping: that try teaches nothing either.
	learn := func(t *testing.T) bool {
		t.Helper()
		b.copyLate = 0 // the test's goroutine is the reader: rmu is free
		if !answer(t, time.Millisecond) {
			return false
		}
		late := b.copyLate
		return late >= 800*time.Microsecond && late <= maxCopySpin
	}
	// Tries keep a descheduled writer on a loaded machine from failing it: each takes
	// about 2.5 ms, and a CI race run beside other packages failed 5 of 5 once. A reader
	// that does not learn, or does not poll, fails every try.
	const tries = 50
	t.Run("quiet", func(t *testing.T) {
		defer idle.ForceQuiet(true)()
		var unlearned, slept, kept int
		for range tries {
			if !learn(t) {
				unlearned++
				continue
			}
			if answer(t, time.Millisecond) {
				slept++
				continue
			}
			if answer(t, 20*time.Microsecond); b.copyLate != 0 {
				kept++ // the writer came past the copy's 200 µs
				continue
			}
			return
		}
		t.Fatalf("in %d tries: %d did not sleep and learn the 1 ms lateness, %d slept through an answer as late as the last, %d kept it after an early one", tries, unlearned, slept, kept)
	})
	t.Run("busy", func(t *testing.T) {
		defer idle.ForceQuiet(false)()
		var unlearned, polled int
		for range tries {
			if !learn(t) {
				unlearned++
				continue
			}
			if !answer(t, time.Millisecond) {
				polled++ // or descheduled through its spin
				continue
			}
			return
		}
		t.Fatalf("in %d tries: %d did not sleep and learn the 1 ms lateness, %d polled past the copy for a late answer with no cores to spare", tries, unlearned, polled)
	})
}

// TestCopyLateFit: how much lateness a reader allows the next answer behind a copy.
func TestCopyLateFit(t *testing.T) {
	for _, tc := range []struct {
		was, late, want time.Duration
	}{
		{0, -time.Microsecond, 0},                                         // early: nothing to allow
		{time.Millisecond, 0, 0},                                          // on time: forget
		{0, 100 * time.Microsecond, 125 * time.Microsecond},               // a quarter more than seen
		{0, 1900 * time.Microsecond, maxCopySpin},                         // at most maxCopySpin
		{300 * time.Microsecond, maxCopySpin + 1, 300 * time.Microsecond}, // an idle peer: keep
	} {
		if got := copyLateFit(tc.was, tc.late); got != tc.want {
			t.Errorf("copyLateFit(%v, %v) = %v, want %v", tc.was, tc.late, got, tc.want)
		}
	}
}

// TestReadersShareThePolling: of two connections a process dialed, read at once with one
// reader of the group polling (GOMAXPROCS 2), the second waits watched, its ring polled by
// the first, and each gets its own bytes; the second counts a watched wait.
func TestReadersShareThePolling(t *testing.T) {
	leakcheck.Check(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	time.Sleep(2 * time.Millisecond) // idle.MaxProcs reads GOMAXPROCS anew
	long := Config{Spin: 10 * time.Second}
	a, as := connPair(t, long, Config{})
	b, bs := connPair(t, long, Config{})
	read := func(c *Conn) <-chan string {
		out := make(chan string, 1)
		go func() {
			p := make([]byte, 8)
			n, err := c.Read(p)
			if err != nil {
				out <- err.Error()
				return
			}
			out <- string(p[:n])
		}()
		return out
	}
	gotA := read(a)
	waitFor(t, "the first reader polls", func() bool { return dialedReaders.pollingNow() == 1 })
	gotB := read(b)
	waitFor(t, "the second reader is watched", func() bool { return dialedReaders.watching() == 1 })
	for _, m := range []struct {
		to   *Conn
		msg  string
		from <-chan string
	}{{bs, "to b", gotB}, {as, "to a", gotA}} {
		if _, err := m.to.Write([]byte(m.msg)); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-m.from:
			if got != m.msg {
				t.Fatalf("read %q, want %q", got, m.msg)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%q not read within 5s", m.msg)
		}
	}
	if w := b.Stats().Watched; w != 1 {
		t.Errorf("the second reader counted %d watched waits, want 1", w)
	}
	if p, w := dialedReaders.pollingNow(), dialedReaders.watching(); p != 0 || w != 0 {
		t.Errorf("after both reads: %d polling, %d watched, want none", p, w)
	}
}
