package soft

import (
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// chunkReader returns its bytes at most n at a time, as a socket may, and counts what it
// handed out.
type chunkReader struct {
	b   []byte
	n   int
	off int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.off == len(r.b) {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b[r.off:])
	r.off += k
	return k, nil
}

type testFrame struct {
	h       header
	payload []byte
}

// frameStream encodes frames with payloads of around smallMax and batchFrameMax bytes as
// the sender does, with one flush at the end: the small and medium frames on either side of
// the large one go as BATCHes.
func frameStream() ([]testFrame, []byte) {
	var frames []testFrame
	for i, n := range []int{0, 1, 64, smallMax - 1, smallMax, smallMax + 1, batchFrameMax, batchFrameMax + 1, 0, 3} {
		p := bytes.Repeat([]byte{byte(i + 1)}, n)
		frames = append(frames, testFrame{header{op: opSend, psn: uint32(i), len: uint32(n)}, p})
		frames = append(frames, testFrame{header{op: opAck, psn: uint32(i)}, nil})
	}
	w := &writeRecorder{}
	l := &tcpLink{q: bareQP(), conn: w}
	for _, f := range frames {
		if err := l.send(&f.h, [][]byte{f.payload}); err != nil {
			panic(err)
		}
	}
	if err := l.flush(); err != nil {
		panic(err)
	}
	return frames, bytes.Join(w.writes, nil)
}

// writeRecorder is a stream that keeps each write apart (or, with discard, drops them).
type writeRecorder struct {
	net.Conn // nil: only Write is used
	writes   [][]byte
	discard  bool
}

func (w *writeRecorder) Write(p []byte) (int, error) {
	if !w.discard {
		w.writes = append(w.writes, bytes.Clone(p))
	}
	return len(p), nil
}

// TestLinkWrites: small and medium frames wait for flush and leave in one write, as they
// are when alone (a medium one with its padding) and as a BATCH when more (a full batch
// leaves at once), without allocating; their payloads count as copied. A large frame
// first flushes what waits, then is written from its segments (one writev on a socket:
// header, padding, payload) without a copy.
func TestLinkWrites(t *testing.T) {
	const batchFull = batchMax/(headerLen+smallMax) + 1 // small frames that overflow a batch
	for _, tc := range []struct {
		name   string
		sizes  []int
		writes []int // each write's length
	}{
		{"one small frame", []int{64}, []int{headerLen + 64}},
		{"an empty frame", []int{0}, []int{headerLen}},
		{"small frames together", []int{0, 64, smallMax}, []int{headerLen + 3*headerLen + 64 + smallMax}},
		{"a medium frame alone", []int{smallMax + 1}, []int{headerLen, smallMax, smallMax + 1}},
		{"medium frames together", []int{1000, batchFrameMax}, []int{3*headerLen + 1000 + batchFrameMax}},
		{"small, then medium", []int{1, 2, 4096}, []int{4*headerLen + 4099}},
		{"large frame", []int{batchFrameMax + 2}, []int{headerLen, smallMax, batchFrameMax/2 + 1, batchFrameMax/2 + 1}},
		{"small, then large", []int{1, 2, 2 * batchFrameMax}, []int{3*headerLen + 3, headerLen, smallMax, batchFrameMax, batchFrameMax}},
		{"large, then small", []int{2 * batchFrameMax, 1}, []int{headerLen, smallMax, batchFrameMax, batchFrameMax, headerLen + 1}},
		{"a full batch", repeat(smallMax, batchFull), []int{headerLen + (batchFull-1)*(headerLen+smallMax), headerLen + smallMax}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &writeRecorder{}
			l := &tcpLink{q: bareQP(), conn: w}
			var frames []testFrame
			var small, large uint64
			for i, n := range tc.sizes {
				f := testFrame{header{op: opSend, psn: uint32(i), len: uint32(n)}, bytes.Repeat([]byte{byte(i)}, n)}
				frames = append(frames, f)
				if err := l.send(&f.h, [][]byte{f.payload[:n/2], f.payload[n/2:]}); err != nil {
					t.Fatal(err)
				}
				if n <= batchFrameMax {
					small += uint64(n)
				} else {
					large += uint64(n)
				}
			}
			if err := l.flush(); err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, b := range w.writes {
				got = append(got, len(b))
			}
			if !slices.Equal(got, tc.writes) {
				t.Fatalf("writes of %v bytes, want %v", got, tc.writes)
			}
			readFrames(t, bytes.Join(w.writes, nil), headerLen+smallMax, frames)
			if st := l.q.dev.Stats(); st.CopyBytes != small || st.SocketTxBytes != large {
				t.Fatalf("stats %+v, want %d bytes copied and %d written from registered memory", st, small, large)
			}
			w.discard = true
			f := frames[0]
			if allocs := testing.AllocsPerRun(100, func() {
				_ = l.send(&f.h, [][]byte{f.payload})
				_ = l.send(&f.h, [][]byte{f.payload})
				_ = l.flush()
			}); allocs != 0 {
				t.Fatalf("%.0f allocations per two frames", allocs)
			}
		})
	}
}

func repeat(n, times int) []int {
	s := make([]int, times)
	for i := range s {
		s[i] = n
	}
	return s
}

// readFrames parses stream in reads of at most chunk bytes and checks that it holds want.
func readFrames(t *testing.T, stream []byte, chunk int, want []testFrame) {
	t.Helper()
	r := &chunkReader{b: stream, n: chunk}
	fr := frameReader{r: r}
	for i, want := range want {
		var h header
		small, err := fr.next(&h)
		if err != nil {
			t.Fatalf("chunks of %d, frame %d: %v", chunk, i, err)
		}
		if h != want.h {
			t.Fatalf("chunks of %d, frame %d: header %+v, want %+v", chunk, i, h, want.h)
		}
		got := small
		switch {
		case small != nil && h.len > batchFrameMax:
			t.Fatalf("chunks of %d, frame %d: a large frame returned %d bytes with its header", chunk, i, len(small))
		case small == nil && h.len <= smallMax:
			t.Fatalf("chunks of %d, frame %d: a small frame came without its payload", chunk, i)
		case small == nil:
			got = make([]byte, h.len)
			if _, err := io.ReadFull(&fr, got); err != nil {
				t.Fatalf("chunks of %d, frame %d: payload: %v", chunk, i, err)
			}
		}
		if !bytes.Equal(got, want.payload) {
			t.Fatalf("chunks of %d, frame %d: payload differs", chunk, i)
		}
	}
	var h header
	if _, err := fr.next(&h); err != io.EOF {
		t.Fatalf("chunks of %d: after the last frame: %v, want EOF", chunk, err)
	}
}

// TestFrameReader: frames of every size class come back whole whatever the read sizes, a
// small one with its header (or its BATCH), and no byte of a larger payload is read with a
// header.
func TestFrameReader(t *testing.T) {
	frames, stream := frameStream()
	for _, chunk := range []int{1, 7, headerLen, headerLen + 1, headerLen + smallMax, 1 << 20} {
		readFrames(t, stream, chunk, frames)
	}
}

// TestFrameReaderRejects: a stream that ends inside a frame, or a bad header, is an error.
func TestFrameReaderRejects(t *testing.T) {
	_, stream := frameStream()
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"cut in a header", stream[:headerLen-1], io.ErrUnexpectedEOF},
		{"cut in a small payload", stream[:3*headerLen], io.ErrUnexpectedEOF},
		{"bad opcode", append([]byte{0}, stream[1:]...), errFrame},
		{"cut in a BATCH", batch(enc(opAck, 0), enc(opAck, 0))[:headerLen+50], io.ErrUnexpectedEOF},
		{"BATCH inside a BATCH", batch(batch(enc(opAck, 0), enc(opAck, 0))), errFrame},
		{"BATCH carrying a large frame", batch(enc(opSend, batchFrameMax+1), enc(opAck, 0)), errFrame},
		{"frame overrunning its BATCH", batch(enc(opAck, 0), enc(opSend, 5)[:headerLen]), errFrame},
		{"BATCH of one header", batch(enc(opAck, 0)), errFrame},
		{"BATCH over batchMax", appendHeader(nil, &header{op: opBatch, len: batchMax + 1}), errFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fr := frameReader{r: &chunkReader{b: tc.b, n: 5}}
			var h header
			var err error
			for err == nil {
				_, err = fr.next(&h)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// enc encodes a frame with n payload bytes (zeros).
func enc(op opcode, n int) []byte {
	return append(appendHeader(nil, &header{op: op, len: uint32(n)}), make([]byte, n)...)
}

// batch wraps frames in a BATCH as they are, valid or not.
func batch(frames ...[]byte) []byte {
	b := bytes.Join(frames, nil)
	h := appendHeader(nil, &header{op: opBatch, len: uint32(len(b))})
	return append(append(h, b...), make([]byte, headerLen)...) // and some bytes after it
}

// FuzzFrameReader feeds the frame reader arbitrary streams in arbitrary read sizes: it must
// not panic or loop, a small frame's payload is exactly its length, a BATCH is never
// returned (only its frames), and a large frame's payload, taken with Read (part of it may
// have come with its header), is exactly the stream's bytes behind its header and padding.
func FuzzFrameReader(f *testing.F) {
	_, stream := frameStream()
	f.Add(stream, uint8(7))
	f.Add(stream[:100], uint8(0))
	f.Add(batch(enc(opAck, 0), enc(opSend, 3), enc(opSend, smallMax+1)), uint8(40))
	f.Add(batch(enc(opSend, batchFrameMax+1)), uint8(9))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		r := &chunkReader{b: b, n: int(chunk)%(headerLen+smallMax+3) + 1}
		fr := frameReader{r: r}
		for {
			var h header
			small, err := fr.next(&h)
			if err != nil {
				return // each frame takes at least headerLen bytes: this ends
			}
			if h.op == opBatch {
				t.Fatal("a BATCH came out of the reader")
			}
			if small != nil { // a small frame, or a small or medium one of a BATCH
				if len(small) != int(h.len) || h.len > batchFrameMax {
					t.Fatalf("frame of %d bytes returned %d with its header", h.len, len(small))
				}
				continue
			}
			if h.len <= smallMax {
				t.Fatalf("a frame of %d bytes came without its payload", h.len)
			}
			at := r.off - (fr.have - fr.off - fr.used) // the payload's first byte in b
			if int64(h.len) > int64(len(b)-at) {
				return // the stream ends inside the payload
			}
			got := make([]byte, h.len)
			if _, err := io.ReadFull(&fr, got); err != nil {
				t.Fatalf("payload of %d bytes at %d: %v", h.len, at, err)
			}
			if !bytes.Equal(got, b[at:at+int(h.len)]) {
				t.Fatalf("payload of %d bytes at %d differs from the stream's", h.len, at)
			}
		}
	})
}

// TestTryFlush: what a stream reader transmits goes with writes that never wait
// (tcpLink.tryFlush): a small frame alone, a medium one alone (padded), several as a BATCH,
// and, while trying, large ones copied behind them. With the socket full it writes what
// fits, or nothing, and returns at once; the engine's next flush writes the rest first.
// Every frame arrives once, intact, in order, and a frame sent so costs no allocation.
func TestTryFlush(t *testing.T) {
	tc, peer := tcpPair(t)
	_ = tc.(*net.TCPConn).SetWriteBuffer(16 << 10)
	_ = peer.(*net.TCPConn).SetReadBuffer(16 << 10)
	raw, err := tc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	l := &tcpLink{q: bareQP(), conn: tc, raw: raw}
	var sent []testFrame
	next := func(n int) testFrame {
		f := testFrame{header{op: opSend, psn: uint32(len(sent)), len: uint32(n)}, bytes.Repeat([]byte{byte(len(sent))}, n)}
		sent = append(sent, f)
		return f
	}
	queue := func(sizes ...int) {
		for _, n := range sizes {
			f := next(n)
			if err := l.send(&f.h, [][]byte{f.payload}); err != nil {
				t.Fatal(err)
			}
		}
	}
	f := next(64)
	if allocs := testing.AllocsPerRun(100, func() {
		_ = l.send(&f.h, [][]byte{f.payload})
		_, _ = l.tryFlush()
	}); allocs != 0 {
		t.Errorf("%.1f allocations per frame sent with tryFlush", allocs)
	}
	for range 100 { // AllocsPerRun's runs, after one to warm up
		sent = append(sent, f)
	}
	for _, sizes := range [][]int{{64}, {4096}, {0, 64, 4096}} {
		queue(sizes...)
		if done, err := l.tryFlush(); !done || err != nil {
			t.Fatalf("frames of %v bytes to an empty socket: done %v, %v", sizes, done, err)
		}
	}
	// Nobody reads: the socket fills, and tryFlush must neither wait nor lose anything.
	full := false
	for i := 0; i < 10000 && !full; i++ {
		if i%2 == 0 { // a BATCH written in place, or a large frame staged behind it
			queue(batchFrameMax, 100)
		} else {
			l.trying = true
			queue(batchFrameMax, 100, 3*batchFrameMax)
			l.trying = false
		}
		start := time.Now()
		done, err := l.tryFlush()
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("tryFlush waited %v", d)
		}
		full = !done
	}
	if !full {
		t.Fatal("the socket never filled")
	}
	last := next(1) // behind what the full socket left: written first, once the peer reads
	sendLast(t, l, peer, sent, last)
}

// bareQP is a QP of a device of its own, no more: enough for a link's writes and reads.
func bareQP() *QP {
	d := &Device{}
	return &QP{dev: d, st: &d.stats[0]}
}

// TestFrameReady: the reader holds responses (tcpLink.cork) only while the rest of the
// current frame and the whole next one are in rb, so that it delivers them without reading
// the stream (before any read it lets go, whatever cork says).
func TestFrameReady(t *testing.T) {
	small := append(appendHeader(nil, &header{op: opSend, len: 8}), make([]byte, 8)...)
	batch := appendHeader(nil, &header{op: opBatch, len: uint32(2 * len(small))})
	batch = append(append(batch, small...), small...)
	large := appendHeader(nil, &header{op: opSend, len: smallMax + 1})
	large = append(append(large, zeroPad[:]...), make([]byte, smallMax+1)...)
	for _, tc := range []struct {
		name  string
		rb    []byte
		rest  int
		batch []byte
		want  bool
	}{
		{"nothing read", nil, 0, nil, false},
		{"part of a header", small[:headerLen-1], 0, nil, false},
		{"a header without its payload", small[:headerLen], 0, nil, false},
		{"a small frame but its last byte", small[:len(small)-1], 0, nil, false},
		{"a whole small frame", small, 0, nil, true},
		{"a whole BATCH", batch, 0, nil, true},
		{"a BATCH but its last byte", batch[:len(batch)-1], 0, nil, false},
		{"a whole larger frame", large, 0, nil, true},
		{"a larger frame but its last byte", large[:len(large)-1], 0, nil, false},
		{"the current frame's rest, then a small frame", append(make([]byte, 100), small...), 100, nil, true},
		{"part of the current frame's rest", make([]byte, 50), 100, nil, false},
		{"frames left in the current BATCH", nil, 0, small, true},
	} {
		f := &frameReader{rb: tc.rb, have: len(tc.rb), batch: tc.batch}
		if got := f.aheadWhole(tc.rest); got != tc.want {
			t.Errorf("%s: aheadWhole(%d) = %v, want %v", tc.name, tc.rest, got, tc.want)
		}
	}
}

// TestFrameReaderHeaderAlone: a reader whose payloads go straight into their destination
// (direct) reads a frame's header and padding alone after a frame larger than readAhead,
// so that none of the next large payload is read ahead into rb (to be copied out of it),
// and reads ahead again after a small frame. A reader that is not direct reads ahead
// always.
func TestFrameReaderHeaderAlone(t *testing.T) {
	large := func(i int) testFrame {
		return testFrame{header{op: opSend, psn: uint32(i), len: 64 << 10}, bytes.Repeat([]byte{byte(i + 1)}, 64<<10)}
	}
	small := func(i int) testFrame {
		return testFrame{header{op: opSend, psn: uint32(i), len: 64}, bytes.Repeat([]byte{byte(i + 1)}, 64)}
	}
	frames := []testFrame{large(0), large(1), small(2), small(3), large(4)}
	w := &writeRecorder{}
	l := &tcpLink{q: bareQP(), conn: w}
	for _, f := range frames {
		if err := l.send(&f.h, [][]byte{f.payload}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.flush(); err != nil {
		t.Fatal(err)
	}
	stream := bytes.Join(w.writes, nil)
	for _, tc := range []struct {
		direct bool
		ahead  []bool // per frame: payload bytes read ahead with its header
	}{
		{true, []bool{false, false, false, false, true}},
		{false, []bool{false, true, false, false, true}},
	} {
		fr := frameReader{r: &chunkReader{b: stream, n: 1 << 20}, direct: tc.direct}
		for i, want := range frames {
			var h header
			small, err := fr.next(&h)
			if err != nil {
				t.Fatalf("direct %v, frame %d: %v", tc.direct, i, err)
			}
			got := small
			if small == nil {
				if ahead := fr.have - fr.off - fr.used; (ahead > 0) != tc.ahead[i] {
					t.Fatalf("direct %v, frame %d: %d payload bytes read ahead with the header, want some: %v", tc.direct, i, ahead, tc.ahead[i])
				}
				got = make([]byte, h.len)
				if _, err := io.ReadFull(&fr, got); err != nil {
					t.Fatalf("direct %v, frame %d: payload: %v", tc.direct, i, err)
				}
			}
			if !bytes.Equal(got, want.payload) {
				t.Fatalf("direct %v, frame %d: payload differs", tc.direct, i)
			}
		}
	}
}
