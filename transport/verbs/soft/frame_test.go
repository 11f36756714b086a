package soft

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
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

// frameStream encodes frames with payloads of around smallMax bytes as the sender does.
func frameStream() ([]testFrame, []byte) {
	var frames []testFrame
	for i, n := range []int{0, 1, 64, smallMax - 1, smallMax, smallMax + 1, 4096, 0, 3} {
		p := bytes.Repeat([]byte{byte(i + 1)}, n)
		frames = append(frames, testFrame{header{op: opSend, psn: uint32(i), len: uint32(n)}, p})
		frames = append(frames, testFrame{header{op: opAck, psn: uint32(i)}, nil})
	}
	w := &writeRecorder{}
	l := &tcpLink{q: &QP{dev: &Device{}}, conn: w}
	for _, f := range frames {
		if err := l.send(&f.h, [][]byte{f.payload}); err != nil {
			panic(err)
		}
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

// TestLinkWrites: a frame of at most smallMax payload bytes leaves in one write, header and
// payload together, without allocating (the payload counts as copied); a larger one is
// written from its segments (one writev on a socket: header, padding, payload), without
// a copy.
func TestLinkWrites(t *testing.T) {
	for _, n := range []int{0, 1, 64, smallMax - 1, smallMax, smallMax + 1, 4096} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := &writeRecorder{}
			l := &tcpLink{q: &QP{dev: &Device{}}, conn: w}
			h := header{op: opSend, psn: 7, len: uint32(n)}
			payload := [][]byte{bytes.Repeat([]byte{1}, n/2), bytes.Repeat([]byte{2}, n-n/2)}
			if err := l.send(&h, payload); err != nil {
				t.Fatal(err)
			}
			want := 1
			if n > smallMax {
				want = 4 // header, padding and the two segments, a write each on this stream
			}
			if len(w.writes) != want {
				t.Fatalf("%d writes, want %d", len(w.writes), want)
			}
			b := bytes.Join(w.writes, nil)
			var got header
			if _, err := parseHeader(b[:headerLen], &got); err != nil || got != h {
				t.Fatalf("header %+v (%v), want %+v", got, err, h)
			}
			if n > smallMax {
				b = b[smallMax:]
			}
			if !bytes.Equal(b[headerLen:], bytes.Join(payload, nil)) {
				t.Fatal("payload differs")
			}
			st := l.q.dev.Stats()
			if small := n <= smallMax; small && (st.CopyBytes != uint64(n) || st.SocketTxBytes != 0) ||
				!small && (st.CopyBytes != 0 || st.SocketTxBytes != uint64(n)) {
				t.Fatalf("stats %+v after a frame of %d bytes", st, n)
			}
			w.discard = true
			if allocs := testing.AllocsPerRun(100, func() { _ = l.send(&h, payload) }); allocs != 0 {
				t.Fatalf("%.0f allocations per frame", allocs)
			}
		})
	}
}

// TestFrameReader: frames of every size class come back whole whatever the read sizes, a
// small one with its header, and no byte of a larger payload is read with a header.
func TestFrameReader(t *testing.T) {
	frames, stream := frameStream()
	for _, chunk := range []int{1, 7, headerLen, headerLen + 1, headerLen + smallMax, 1 << 20} {
		r := &chunkReader{b: stream, n: chunk}
		fr := frameReader{r: r}
		for i, want := range frames {
			var h header
			small, err := fr.next(&h)
			if err != nil {
				t.Fatalf("chunks of %d, frame %d: %v", chunk, i, err)
			}
			if h != want.h {
				t.Fatalf("chunks of %d, frame %d: header %+v, want %+v", chunk, i, h, want.h)
			}
			got := small
			if h.len > smallMax {
				if small != nil {
					t.Fatalf("chunks of %d, frame %d: a large frame returned %d bytes with its header", chunk, i, len(small))
				}
				got = make([]byte, h.len)
				if _, err := io.ReadFull(r, got); err != nil {
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

// FuzzFrameReader feeds the frame reader arbitrary streams in arbitrary read sizes: it must
// not panic or loop, a small frame's payload is exactly its length, and a large frame's
// header never brings payload bytes with it.
func FuzzFrameReader(f *testing.F) {
	_, stream := frameStream()
	f.Add(stream, uint8(7))
	f.Add(stream[:100], uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		r := &chunkReader{b: b, n: int(chunk)%(headerLen+smallMax+3) + 1}
		fr := frameReader{r: r}
		for {
			start := r.off - (fr.have - fr.used) // the frame's first byte in b
			var h header
			small, err := fr.next(&h)
			if err != nil {
				return // each frame takes at least headerLen bytes: this ends
			}
			if h.len <= smallMax {
				if len(small) != int(h.len) {
					t.Fatalf("small frame of %d bytes returned %d", h.len, len(small))
				}
				continue
			}
			if small != nil || r.off != start+headerLen+smallMax {
				t.Fatalf("large frame at %d: read up to %d with its header, want %d", start, r.off, start+headerLen+smallMax)
			}
			if int64(h.len) > int64(len(b)-r.off) {
				return // the stream ends inside the payload
			}
			r.off += int(h.len) // the payload, which the QP would read into registered memory
		}
	})
}
