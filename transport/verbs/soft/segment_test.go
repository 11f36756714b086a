package soft

import (
	"bytes"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// tapConn records what is written to it once recording is set (after the connection
// setup); the first write of a READ response segment's payload waits until release is
// closed, so that a test can post work meanwhile.
type tapConn struct {
	net.Conn
	mu        sync.Mutex
	recording bool
	written   bytes.Buffer
	held      bool
	holding   chan struct{} // closed when the first large write is held
	release   chan struct{}
}

func (c *tapConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	hold := !c.held && len(p) >= readSegMax
	c.held = c.held || hold
	if c.recording {
		c.written.Write(p)
	}
	c.mu.Unlock()
	if hold {
		close(c.holding)
		<-c.release
	}
	return c.Conn.Write(p)
}

// TestReadResponseSegments: a READ response longer than readSegMax leaves in segments, a
// SEND posted while the first is on its way goes out before the second, and the requester
// places every segment at its offset and completes the READ with its last byte.
func TestReadResponseSegments(t *testing.T) {
	const size = 4*readSegMax + 1000
	a, b := newHost(t, mustOpen(t), 2*size), newHost(t, mustOpen(t), 2*size)
	defer a.close(t)
	defer b.close(t)
	tap := &tapConn{holding: make(chan struct{}), release: make(chan struct{})}
	connectVia(t, a, b, func(c net.Conn) net.Conn { tap.Conn = c; return tap })
	tap.mu.Lock()
	tap.recording = true
	tap.mu.Unlock()
	src := b.mr.Bytes()[:size]
	for i := range src {
		src[i] = byte(i * 7)
	}
	must(t, a.qp.PostRecv([]verbs.RecvWR{{WRID: 50, SGL: []verbs.SGE{verbs.SGEFor(a.mr, size, 64)}}}))
	must(t, a.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL:        []verbs.SGE{verbs.SGEFor(a.mr, 0, size/2), verbs.SGEFor(a.mr, size/2, size-size/2)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}))
	select {
	case <-tap.holding:
	case <-time.After(5 * time.Second):
		t.Fatal("the READ response did not start")
	}
	must(t, b.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline,
		SGL: []verbs.SGE{verbs.SGEFor(b.mr, 0, 8)}}}))
	close(tap.release)

	// a: the SEND's receive completes before the READ, whose bytes are all in place.
	if wc := a.poll(t); wc.WRID != 50 || wc.Status != verbs.WCSuccess {
		t.Fatalf("first completion %+v; want the receive of the SEND that passed the READ response", wc)
	}
	if wc := a.poll(t); wc.WRID != 1 || wc.Status != verbs.WCSuccess || wc.ByteLen != size {
		t.Fatalf("READ completion %+v; want success with %d bytes", wc, size)
	}
	if !bytes.Equal(a.mr.Bytes()[:size], src) {
		t.Fatal("READ data differs")
	}
	if wc := b.poll(t); wc.WRID != 2 || wc.Status != verbs.WCSuccess {
		t.Fatalf("SEND completion %+v", wc)
	}

	// The wire: segment, SEND, then the other segments at their offsets.
	tap.mu.Lock()
	stream := bytes.Clone(tap.written.Bytes())
	tap.mu.Unlock()
	r := bytes.NewReader(stream)
	fr := frameReader{r: r}
	var order []string
	for {
		var h header
		small, err := fr.next(&h)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.op == opReadResp:
			order = append(order, "RESP@"+strconv.Itoa(int(h.raddr))+"+"+strconv.Itoa(int(h.len)))
		case h.op == opSend:
			order = append(order, "SEND")
		}
		if small == nil && h.len > 0 {
			if _, err := io.CopyN(io.Discard, &fr, int64(h.len)); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []string{"RESP@0+" + strconv.Itoa(readSegMax), "SEND", "RESP@" + strconv.Itoa(readSegMax) + "+" + strconv.Itoa(readSegMax),
		"RESP@" + strconv.Itoa(2*readSegMax) + "+" + strconv.Itoa(readSegMax), "RESP@" + strconv.Itoa(3*readSegMax) + "+" + strconv.Itoa(readSegMax),
		"RESP@" + strconv.Itoa(4*readSegMax) + "+1000"}
	if !slices.Equal(order, want) {
		t.Fatalf("frames on the wire %v, want %v", order, want)
	}
}

// TestReadResponseOutOfOrder: a READ response segment at the wrong offset is a protocol
// violation: the link goes down and the READ fails, nothing lands past what was asked.
func TestReadResponseOutOfOrder(t *testing.T) {
	for _, tc := range []struct {
		name        string
		offset, len uint32
	}{
		{"skips ahead", 100, 8},
		{"past the end", 0, 4097},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newHost(t, mustOpen(t), 1<<16)
			defer a.close(t)
			near, far := net.Pipe()
			defer far.Close()
			must(t, a.qp.Modify(verbs.QPAttr{State: verbs.QPStateInit, Access: verbs.AccessRemoteRead}))
			must(t, a.qp.(verbs.StreamQP).AttachStream(near))
			must(t, a.qp.Modify(verbs.QPAttr{State: verbs.QPStateRTR, Remote: verbs.Endpoint{QPN: 99}, MaxDestRdAtomic: 1}))
			must(t, a.qp.Modify(verbs.QPAttr{State: verbs.QPStateRTS, MaxRdAtomic: 1, Timeout: 5 * time.Second}))
			posted := make(chan error, 1)
			go func() { // a pipe's write waits for its read: the poster transmits inline
				posted <- a.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{verbs.SGEFor(a.mr, 0, 4096)}, RemoteAddr: 0x1000, RKey: 7}})
			}()
			fr := frameReader{r: far}
			var req header
			if _, err := fr.next(&req); err != nil || req.op != opReadReq {
				t.Fatalf("want the READ request, got %+v (%v)", req, err)
			}
			must(t, <-posted)
			resp := header{op: opReadResp, psn: req.psn, len: tc.len, raddr: uint64(tc.offset)}
			w := &tcpLink{q: bareQP(), conn: far}
			go func() {
				_ = w.send(&resp, [][]byte{make([]byte, tc.len)})
				_ = w.flush()
			}()
			wc := a.poll(t)
			if wc.WRID != 1 || wc.Status == verbs.WCSuccess {
				t.Fatalf("READ completion %+v; want a failure", wc)
			}
			if st := a.qp.State(); st != verbs.QPStateError {
				t.Fatalf("QP state %v; want ERR", st)
			}
		})
	}
}

func mustOpen(t *testing.T) *Device {
	t.Helper()
	d, err := OpenTCP("seg")
	if err != nil {
		t.Fatal(err)
	}
	return d
}
