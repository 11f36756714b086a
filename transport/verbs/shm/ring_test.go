package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/idle"
)

// heapRing returns the producer's and the consumer's views of one ring of size bytes in
// ordinary memory (both views of one mapping, as in two processes).
func heapRing(size int) (prod, cons *ring, mem []byte) {
	buf := make([]uint64, ringFileSize(size)/8) // 8-byte aligned
	mem = unsafeBytes(buf)
	initRing(mem, size)
	return newRing(mem, size), newRing(mem, size), mem
}

// TestRingWrap: bytes written across the end of the data area come back in order, and the
// ring reports full and empty at its capacity.
func TestRingWrap(t *testing.T) {
	p, c, mem := heapRing(MinRingSize)
	if err := checkRingHeader(mem, MinRingSize); err != nil {
		t.Fatal(err)
	}
	var want, got []byte
	chunk := make([]byte, 3000)
	for i := range 20 {
		for j := range chunk {
			chunk[j] = byte(i*31 + j)
		}
		n, err := p.write(chunk)
		if err != nil || n != len(chunk) {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
		want = append(want, chunk...)
		buf := make([]byte, 3000)
		if n, err = c.read(buf); err != nil || n != 3000 {
			t.Fatalf("read %d: %d, %v", i, n, err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ across the wrap")
	}
	big := make([]byte, 2*MinRingSize)
	if n, _ := p.write(big); n != MinRingSize {
		t.Fatalf("wrote %d into an empty ring of %d", n, MinRingSize)
	}
	if n, err := p.write(big); n != 0 || err != nil {
		t.Fatalf("write to a full ring: %d, %v", n, err)
	}
	if n, _ := c.read(big); n != MinRingSize {
		t.Fatalf("read %d from a full ring", n)
	}
	if n, err := c.read(big); n != 0 || err != nil {
		t.Fatalf("read from an empty ring: %d, %v", n, err)
	}
}

// TestRingWriteBuffers: buffers written as one come back in order across the wrap, with
// one tail published per call; a full ring takes what fits and leaves the rest in v, cut
// where it stopped; empty buffers are consumed.
func TestRingWriteBuffers(t *testing.T) {
	p, c, _ := heapRing(MinRingSize)
	var want, got []byte
	for i := range 20 {
		parts := [][]byte{bytes.Repeat([]byte{byte(i)}, 36), {}, bytes.Repeat([]byte{0}, 128), bytes.Repeat([]byte{byte(i + 100)}, 2800)}
		v := net.Buffers(append([][]byte{}, parts...))
		before := p.tail.Load()
		n, err := p.writeBuffers(&v)
		if err != nil || n != 36+128+2800 || len(v) != 0 {
			t.Fatalf("write %d: %d, %v, %d buffers left", i, n, err, len(v))
		}
		if p.tail.Load() != before+uint64(n) {
			t.Fatalf("write %d: tail %d, want %d", i, p.tail.Load(), before+uint64(n))
		}
		want = append(want, bytes.Join(parts, nil)...)
		buf := make([]byte, 4000)
		k, err := c.read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:k]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ across the wrap")
	}
	v := net.Buffers{make([]byte, MinRingSize-10), bytes.Repeat([]byte{7}, 30), {1, 2}}
	if n, err := p.writeBuffers(&v); n != MinRingSize || err != nil {
		t.Fatalf("writeBuffers into an empty ring: %d, %v; want %d", n, err, MinRingSize)
	}
	if len(v) != 2 || len(v[0]) != 20 || v[0][0] != 7 {
		t.Fatalf("left %d buffers (first %d bytes); want the last 20 bytes of the second and the third", len(v), len(v[0]))
	}
	if n, err := p.writeBuffers(&v); n != 0 || err != nil || len(v) != 2 {
		t.Fatalf("writeBuffers into a full ring: %d, %v, %d left", n, err, len(v))
	}
}

// TestRingHeader: a header of another size, version or magic is refused.
func TestRingHeader(t *testing.T) {
	_, _, mem := heapRing(MinRingSize)
	for _, tc := range []struct {
		name string
		off  int
		val  uint32
	}{{"magic", offMagic, 0}, {"version", offVersion, 9}, {"size", offLog2, 13}} {
		m := append([]byte{}, mem...)
		binary.LittleEndian.PutUint32(m[tc.off:], tc.val)
		if err := checkRingHeader(m, MinRingSize); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", tc.name, err)
		}
	}
	if err := checkRingHeader(mem[:len(mem)-1], MinRingSize); !errors.Is(err, ErrProtocol) {
		t.Errorf("short mapping: %v", err)
	}
}

// FuzzRing drives a consumer whose peer publishes any tail and a producer whose peer
// publishes any head, with the data area full of the fuzzer's bytes: nothing panics, no
// call moves more bytes than the ring holds or the caller asked for, and every refusal
// is ErrProtocol.
func FuzzRing(f *testing.F) {
	f.Add(uint64(10), uint64(0), uint16(100), []byte("hello"))
	f.Add(uint64(1<<63), uint64(5), uint16(4096), []byte{})
	f.Add(^uint64(0), ^uint64(0), uint16(1), bytes.Repeat([]byte{0xff}, 5000))
	f.Add(uint64(MinRingSize), uint64(MinRingSize+1), uint16(8000), []byte("x"))
	f.Fuzz(func(t *testing.T, tail, head uint64, n uint16, data []byte) {
		p, c, mem := heapRing(MinRingSize)
		copy(mem[ringHeaderLen:], data)
		c.tail.Store(tail)
		buf := make([]byte, n)
		got, err := c.read(buf)
		switch {
		case err != nil && !errors.Is(err, ErrProtocol):
			t.Fatalf("read: %v is not ErrProtocol", err)
		case (err != nil) != (tail > MinRingSize): // the consumer's head is 0
			t.Fatalf("read of a ring with tail %d (head 0, size %d): %v", tail, MinRingSize, err)
		case got > int(n) || got > MinRingSize || uint64(got) > tail:
			t.Fatalf("read %d bytes (asked %d, tail %d)", got, n, tail)
		}
		p.head.Store(head)
		wrote, err := p.write(buf)
		switch {
		case err != nil && !errors.Is(err, ErrProtocol):
			t.Fatalf("write: %v is not ErrProtocol", err)
		case (err != nil) != (-head > MinRingSize): // unread bytes: tail 0 less head, mod 2^64
			t.Fatalf("write to a ring with head %d (tail 0, size %d): %v", head, MinRingSize, err)
		case wrote > int(n) || wrote > MinRingSize:
			t.Fatalf("wrote %d bytes (asked %d)", wrote, n)
		}
	})
}

// FuzzHello: any message parses to a valid ring size or fails with ErrProtocol, and the
// encoder's output parses back.
func FuzzHello(f *testing.F) {
	f.Add(appendHello(nil, MinRingSize))
	f.Add(appendHello(nil, MaxRingSize))
	f.Add([]byte("MWSHMHEL\x01\x00\x00\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		size, err := parseHello(b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("%v is not ErrProtocol", err)
			}
			return
		}
		if !validRingSize(size) {
			t.Fatalf("parsed an invalid ring size %d", size)
		}
		if again := appendHello(nil, size); !bytes.Equal(again, b) {
			t.Fatalf("hello %x parsed to %d, which encodes as %x", b, size, again)
		}
	})
}

// TestReadSpinFits: a reader whose spin has halved (a peer late once) and whose next wait
// ended within Config.Spin, after a sleep, spins long enough for the next such wait; a
// wait longer than Spin (an idle connection) halves it; a writer's spin halves either way.
func TestReadSpinFits(t *testing.T) {
	cfg := Config{Spin: 50 * time.Microsecond}
	r, w := readSpin(cfg), writeSpin(cfg)
	for _, sp := range []*idle.Spinner{&r.normal, &w.normal} {
		sp.Lost(time.Second)           // the peer was late once: 25 µs
		sp.Lost(30 * time.Microsecond) // it answered 30 µs later, after a sleep
	}
	if got := r.normal.Budget(); got != 50*time.Microsecond {
		t.Errorf("a reader's spin after a 30 µs wait: %v, want 50 µs (twice the wait, at most Spin)", got)
	}
	if got := w.normal.Budget(); got != 12500*time.Nanosecond {
		t.Errorf("a writer's spin after two lost waits: %v, want 12.5 µs", got)
	}
	r.normal.Lost(time.Second)
	if got := r.normal.Budget(); got != 25*time.Microsecond {
		t.Errorf("a reader's spin after an idle wait: %v, want 25 µs", got)
	}
	if d := readSpin(Config{}); d.normal.Max() != DefaultSpin {
		t.Errorf("a reader's default spin: %v, want DefaultSpin", d.normal.Max())
	}
}

// TestWaitSpinPick: a reader uses its long, quiet spinner only while the process is quiet
// (idle.Quiet), and never when it has none (Config.QuietSpin zero).
func TestWaitSpinPick(t *testing.T) {
	for _, tc := range []struct {
		name      string
		procs     int
		quiet     time.Duration
		wantQuiet bool
	}{
		{"quiet, many cores", 8, 100 * time.Microsecond, true},
		{"too few cores", 2, 100 * time.Microsecond, false},
		{"no quiet spinner", 8, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(tc.procs))
			time.Sleep(3 * time.Millisecond) // past the last reading of GOMAXPROCS (idle)
			w := readSpin(Config{QuietSpin: tc.quiet})
			if got := w.pick() == &w.quiet; got != tc.wantQuiet {
				t.Fatalf("pick() chose the quiet spinner: %v, want %v", got, tc.wantQuiet)
			}
		})
	}
}
