package rpc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/mwrpc/mwrpc/internal/parcopy"
	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport"
)

// Memory the client lends its caller, so that bulk []byte payloads cross the client
// without a copy: request buffers (Client.Buffer), which a call takes and sends from where
// they lie, and, with WithLentResponses, responses, which the caller reads where the
// transport put them. Each loan is recorded by the address of its first byte until the
// call takes it or the caller gives it back (Client.Release); Close ends the loans left.

// requestHeadroom is what Client.Buffer keeps in front of the caller's bytes for the
// request's envelope (method, deadline, metadata, trace context), written there when the
// call starts so that both leave in one piece. An envelope that does not fit (more than
// about 400 bytes of metadata) makes the call copy the payload once instead.
const requestHeadroom = 512

// loan is one piece of lent memory: a request buffer not yet sent, or a lent response.
type loan struct {
	buf  *pool.Buf           // Buffer's: the whole buffer, headroom included
	resp *transport.Response // a response's, under WithLentResponses
}

// lender records the client's loans, spread over lendShards independently locked parts
// by the address of their first byte. A lent call touches the records four times
// (Buffer's loan, the call's take of it, the response's loan, its Release), and every
// caller does at once: with one lock and one map for all, the callers queue on it and its
// cache lines move from core to core, so that lending costs more CPU per call than copying
// 64 bytes on a many-core client. With shards two loans meet on a lock only when their
// addresses hash alike.
type lender struct {
	shards [lendShards]lendShard
}

// lendShards is the count of the lender's shards (1<<lendShardBits): with 8 cores
// calling at once, two loans meet on a lock about one time in eight.
const (
	lendShardBits = 6
	lendShards    = 1 << lendShardBits
)

// lendShard is one part of the lender, padded to 128 bytes (the adjacent-line prefetch
// of x86, the 128-byte lines of some arm64 parts) so that no two share a cache line.
type lendShard struct {
	loans
	_ [128 - unsafe.Sizeof(loans{})]byte
}

// loans are the loans of one shard.
type loans struct {
	bufs atomic.Int32 // request buffers out here: calls look a []byte up only while some are
	mu   sync.Mutex
	out  map[*byte]loan // guarded by mu
}

// shard returns the part of the lender that records the loan of the memory at key:
// Fibonacci hashing of the address in 64-byte units, whose top bits pick the shard
// (buffers and receive slots lie at multiples of 64 bytes or more apart).
func (l *lender) shard(key *byte) *lendShard {
	h := uint64(uintptr(unsafe.Pointer(key))>>6) * 0x9e3779b97f4a7c15
	return &l.shards[h>>(64-lendShardBits)]
}

func (l *lender) put(key *byte, ln loan) {
	sh := l.shard(key)
	sh.mu.Lock()
	if sh.out == nil {
		sh.out = make(map[*byte]loan)
	}
	sh.out[key] = ln
	if ln.buf != nil {
		sh.bufs.Add(1)
	}
	sh.mu.Unlock()
}

// take ends the loan of the memory p starts at, and returns it; ok is false if none is.
func (l *lender) take(p []byte) (ln loan, ok bool) {
	key := unsafe.SliceData(p)
	if key == nil {
		return loan{}, false
	}
	sh := l.shard(key)
	sh.mu.Lock()
	ln, ok = sh.out[key]
	if ok {
		delete(sh.out, key)
		if ln.buf != nil {
			sh.bufs.Add(-1)
		}
	}
	sh.mu.Unlock()
	return ln, ok
}

// takeRequest ends the loan of a request buffer p starts at, if it is one, and returns
// the buffer; nil otherwise (a response's memory stays lent).
func (l *lender) takeRequest(p []byte) *pool.Buf {
	if cap(p) == 0 {
		return nil
	}
	key := unsafe.SliceData(p)
	sh := l.shard(key)
	if sh.bufs.Load() == 0 {
		return nil
	}
	sh.mu.Lock()
	ln, ok := sh.out[key]
	if ok && ln.buf != nil && len(p) <= ln.buf.Cap()-requestHeadroom {
		delete(sh.out, key)
		sh.bufs.Add(-1)
	} else {
		ln.buf = nil
	}
	sh.mu.Unlock()
	return ln.buf
}

// closeAll ends every loan: the memory goes back to the transport, which is closing.
func (l *lender) closeAll() {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		out := sh.out
		sh.out = nil
		sh.bufs.Store(0)
		sh.mu.Unlock()
		for _, ln := range out {
			ln.end()
		}
	}
}

// releaseBuf releases b, if it is not nil.
func releaseBuf(b *pool.Buf) {
	if b != nil {
		b.Release()
	}
}

func (ln loan) end() {
	if ln.buf != nil {
		ln.buf.Release()
	}
	if ln.resp != nil {
		ln.resp.Release()
	}
}

// Buffer returns n bytes of the client's registered memory to build a []byte request in,
// the client's side of ServerStream.Buffer. A call given them (a generated method on
// []byte both ways, InvokeBytes, or Invoke with a []byte request) sends them from where
// they lie, without a copy (under 1 KiB, request and envelope together, the transport
// copies them into its send slot, which costs less than sending them from where they
// lie), and takes them whatever its outcome: the caller must not use
// them once the call starts. A client stream's message does the same (ClientStream's
// SendBytes, or SendMsg of a []byte, not empty): take a new buffer for the next one. The
// slice given must start where Buffer's does (a prefix of it, or an append within its
// capacity); a slice of it that starts elsewhere is copied like any []byte, and the
// buffer stays lent. Memory not given to a call or a stream goes back with Release, or
// when the client closes. Buffer waits while the client's registered memory is all in use
// (transport.Config.Pool), until ctx ends; n over the largest message fails with
// ResourceExhausted.
func (c *Client) Buffer(ctx context.Context, n int) ([]byte, error) {
	if n < 0 {
		return nil, Errorf(InvalidArgument, "mwrpc: Buffer(%d): negative size", n)
	}
	buf, err := c.tr.Pool().Get(ctx, requestHeadroom+n)
	if err != nil {
		return nil, &Status{Code: ResourceExhausted, Message: fmt.Sprintf("mwrpc: request buffer of %d bytes: %v", n, err), cause: err}
	}
	b := buf.Bytes()[requestHeadroom:buf.Cap()]
	c.lend.put(unsafe.SliceData(b), loan{buf: buf})
	return b[:n], nil
}

// Release returns memory the client lent its caller: a Buffer that no call took, or a
// response under WithLentResponses. p must start where that memory starts (the slice as
// it was given, or a prefix of it). Neither p nor any slice of that memory may be used
// afterwards. Any other slice, or a second Release, is an InvalidArgument error, and
// nothing is released.
func (c *Client) Release(p []byte) error {
	ln, ok := c.lend.take(p)
	if !ok {
		return Errorf(InvalidArgument, "mwrpc: Release of %d bytes at %p: not memory this client lent (a Buffer no call took, or a response under WithLentResponses), or released already", len(p), unsafe.SliceData(p))
	}
	ln.end()
	return nil
}

// lendResponse hands body, the payload of resp, to the caller under WithLentResponses: it
// stays in the transport's memory until Release. An empty body lends nothing.
func (c *Client) lendResponse(resp *transport.Response, body []byte) []byte {
	if len(body) == 0 {
		resp.Release()
		return body
	}
	body = body[:len(body):len(body)] // an append reallocates rather than write past it
	c.lend.put(unsafe.SliceData(body), loan{resp: resp})
	return body
}

// ownResponse returns body as the caller's own: lent (WithLentResponses) or a copy.
func (c *Client) ownResponse(resp *transport.Response, body []byte) []byte {
	if c.opts.lendResponses {
		return c.lendResponse(resp, body)
	}
	probe.Mark(probe.Clone)
	out := parcopy.Clone(body)
	probe.Mark(probe.CloneDone)
	resp.Release()
	return out
}

// callLent sends n bytes the caller built in buf (Buffer's memory): the envelope goes in
// the room Buffer left in front of them, and both leave from there. It takes buf, and
// returns the response and the request's bytes, as sendRequest.
func (c *Client) callLent(ctx context.Context, conn *transport.Conn, method string, deadline int64, md MD, buf *pool.Buf, n int) (*transport.Response, int, error) {
	mem := buf.Bytes()[:0:requestHeadroom] // an envelope that outgrows it moves to the heap
	env := appendRequest(mem, method, deadline, md)
	env = c.tel.inject(ctx, env, md)
	if unsafe.SliceData(env) != unsafe.SliceData(mem) { // copied behind it in a buffer of its own
		defer buf.Release()
		body := buf.Bytes()[requestHeadroom : requestHeadroom+n]
		return c.callRegistered(ctx, conn, method, deadline, md, nil, nil, body, n)
	}
	// Written at the front; moved to end where the body starts.
	buf.Slice(requestHeadroom-len(env), len(env)+n)
	copy(buf.Bytes(), env)
	sent := buf.Len() // CallBuf takes buf
	c.tel.transfer(ctx, AttrRequestSize, AttrRequestTransfer, sent, sent > conn.EagerLimit())
	resp, err := conn.CallBuf(ctx, buf)
	return resp, sent, err
}
