package transport

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Written requests, the twin of written responses (written.go). On a device where a READ
// costs a round trip through the peer's CPU (the soft TCP and shm fabrics), a server that
// has just answered a large request grants its caller memory for the next one: a pool
// buffer zeroed over the request's length rounded up to 64 KiB, bound over those bytes to
// a window that grants REMOTE_WRITE only, announced in a KindGrant SEND. The caller writes
// its next large request there with an RDMA WRITE and announces it in the SEND_WITH_INV
// that revokes the grant (wire.FlagPushed): the request arrives in one trip instead of
// three (header, READ request, READ response), and the revoked grant's buffer becomes the
// request's. Over shm's shared memory the WRITE is placed (the server pulls the request
// from the caller's memory, one copy) and the READ would be too (the caller copies it into
// the server's): the grant saves the READ's two trips, and each side makes one of the
// call's two copies instead of the caller both (1 MiB at one caller on 2 cores, with the
// readers polling through the copies, peerCopies: 235 -> 104 µs p50). Without a grant, or
// with one too small or too old, the request goes through a window for the server to
// READ, as before; a grant too small for it is given back (revoked) by the SEND that
// announces it, so that the next grant fits.
//
// The rules that keep it safe:
//   - A connection holds at most one grant, of at most maxGrant bytes, and all grants of a
//     transport together at most Config.GrantBytes (grantBudget): a peer that never uses
//     its grant holds one buffer, and the lease reclaims it (LOCAL_INV) like any window.
//   - The caller uses a grant only within half the lease of its arrival (the rule every
//     revocation follows: see send), so the window is still bound when the WRITE lands.
//   - The NIC checks the key, range and access of the WRITE: a peer that writes outside its
//     grant gets a remote access error, which fails its connection only.
//   - A grant's buffer is zeroed before it is granted: a peer that announces a write it
//     never made hands its handler zeros, never another connection's bytes.
//   - The server takes a pushed request only in a SEND_WITH_INV that revokes a grant (a
//     window it bound with REMOTE_WRITE alone), no longer than the grant; anything else
//     fails the connection.

// wrPush is the work request kind of a written request's RDMA WRITE (unsignaled: it
// completes only on error); its index is the caller's window the request is bound in.
const wrPush = wrWrite + 1

// maxGrant is the largest grant a connection is given.
const maxGrant = 16 << 20

// grantState is a connection's side of written requests. Guarded by Conn.mu.
type grantState struct {
	out    uint32 // server: the rkey of the grant given to the peer, 0 if none
	outLen int    // its length, counted in Transport.grantBudget until it ends
	giving bool   // server: a grant is being made (grantFor)
	in     peerGrant
}

// peerGrant is a grant the peer gave this side (a caller).
type peerGrant struct {
	addr uint64
	rkey uint32
	n    uint32
	at   time.Time // when it arrived: it is used within half the lease of that
}

// grantFor gives the peer a grant for a next request of about n bytes, if it has none and
// the budget allows. It runs after a large request's response was posted, so that the
// zeroing and the grant's SEND overlap the response's way to the caller. It never waits.
func (c *Conn) grantFor(n int) {
	if n > maxGrant || c.t.cfg.GrantBytes <= 0 {
		return
	}
	c.mu.Lock()
	if c.grant.out != 0 || c.grant.giving || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.grant.giving = true
	c.mu.Unlock()
	buf, w, size, ok := c.takeGrantBuf(n)
	if !ok {
		c.mu.Lock()
		c.grant.giving = false
		c.mu.Unlock()
		return
	}
	bind, err := c.win.ws.BindBufWR(w, buf, verbs.AccessRemoteWrite, wrid(wrBind, c.id, w.Index()))
	if err != nil {
		_ = c.win.ws.Cancel(w)
		c.dropGrantBuf(buf, size)
		return
	}
	rkey := w.RKey()
	h := wire.Header{Kind: wire.KindGrant, Len: uint32(buf.Len()), RKey: rkey, Addr: buf.Addr()}
	c.mu.Lock() // recorded before the post: the peer may use and revoke it before send returns
	c.grant.out, c.grant.outLen, c.grant.giving = rkey, size, false
	c.t.grants.Add(1)
	c.mu.Unlock()
	c.win.ws.Hold(w)
	pre := [1]verbs.SendWR{bind}
	if posted, _ := c.send(context.Background(), &h, nil, pre[:], revoke{}, sendTry); posted {
		c.win.ws.Announced(w, rkey)
		c.t.counters.granted.Add(1)
		return
	}
	c.mu.Lock() // not posted: the binding is ours to cancel, unless teardown took it
	if c.grant.out == rkey {
		c.endGrantLocked()
	}
	if !c.torn.Load() {
		_ = c.win.ws.Cancel(w)
		buf.Release()
	}
	c.mu.Unlock()
}

// grantRound is what a grant's length is rounded up to: requests a little longer than the
// one that led to it fit too, and the zeroing stays near the request's size rather than
// its pool class's (a 1 MiB payload with its envelope is in the 2 MiB class).
const grantRound = 64 << 10

// peerCopies tells a device whose transfers are placed (placesTransfers) that the peer
// copies n bytes, a WRITE of this side's that it pulls, before it answers: the shm
// fabric's reader then polls through the copy instead of sleeping (shm.Conn.PeerCopies),
// and meets the answer. It is told for a connection's lone call (its request written into
// a grant, or its response written), whose caller waits on nothing else: with calls or
// streams beside it the reader has other frames coming, and on a machine short of cores
// (two processes on 2) polling longer takes the CPU those calls need (1 MiB at 16
// callers: 0.85x the calls when every written transfer told it).
func (c *Conn) peerCopies(n int) {
	if !c.placesTransfers() {
		return
	}
	if p, ok := c.qp.(interface{ PeerCopies(n int) }); ok {
		p.PeerCopies(n)
		c.t.counters.copyPolls.Add(1)
	}
}

// placeLargeMin is the payload above which a SEND's placement over shared memory depends
// on what else is in flight (placeLarge): soft.PlacedSendMax.
const placeLargeMin = 16 << 10

// placeLarge tells a device whose transfers are placed whether the large SEND about to be
// posted is a lone call's request (lone: through the stream, where the two sides' copies
// overlap; soft.QP.PlaceLargeSends) or anything else: placed, one copy per message and less
// CPU for each. A response is placed even when it answers a lone call. The server sees
// its calls one at a time when it runs them inline, so a response's own side cannot tell
// a lone caller from a busy one, and placed it costs the caller no more: 64 KiB calls over
// shm on 2 cores (two processes, 2026-11-28, eight alternating pairs against the build that
// streamed the responses of a side serving one call, read over the pairs in which
// shmipc-go held steady) did 1.18x the calls at one caller, 1.10x at 16 and 1.13x at 64;
// 32 KiB 1.11x at 16 and level at one. Placing lone requests too lost at one caller
// (0.75x at 64 KiB, p50 21.6 -> 44.4 µs).
func (c *Conn) placeLarge(lone bool) {
	if !c.placesTransfers() {
		return
	}
	if p, ok := c.qp.(interface{ PlaceLargeSends(bool) }); ok {
		p.PlaceLargeSends(!lone)
	}
}

// loneLocked reports whether a message about to leave is a lone call's, the connection's
// only traffic: a request (request true) while it is the only call in flight; anything
// else (a response, a stream message) while this side serves at most one call, no stream,
// and has no call of its own in flight (a client's streams are among its calls). The
// shm fabric's choices for such a message differ (peerCopies; placeLarge for a request).
// Conn.mu is held.
func (c *Conn) loneLocked(request bool) bool {
	if request {
		return c.calls.lenLocked() <= 1
	}
	return c.serving.calls.len() <= 1 && len(c.serving.streams) == 0 && c.calls.lenLocked() == 0
}

// placesTransfers reports whether the connection's READs and WRITEs are placed (the shm
// fabric's shared memory: soft.QP.PlacesTransfers): a copy into registered memory there
// may be split over idle cores (CopyIn), and a lone call's reader polls through the peer's
// copies (peerCopies). The provider is asked (under its QP's lock) until the connection is
// ready, then the answer is kept: a large message's copy asks on every call (CopyIn).
func (c *Conn) placesTransfers() bool {
	if v := c.placed.Load(); v != 0 {
		return v > 0
	}
	p, ok := c.qp.(interface{ PlacesTransfers() bool })
	placed := ok && p.PlacesTransfers()
	if c.ready.Load() { // connected: the wire is known and stays
		v := int32(-1)
		if placed {
			v = 1
		}
		c.placed.Store(v)
	}
	return placed
}

// takeGrantBuf takes what a grant of at least n bytes needs: the budget (the buffer's
// whole class, size), a pool buffer zeroed over the grant's length (its Len) and a free
// window. ok false: one of them is short.
func (c *Conn) takeGrantBuf(n int) (buf *pool.Buf, w *pool.Window, size int, ok bool) {
	buf, err := c.t.pool.TryGet(n)
	if err != nil {
		return nil, nil, 0, false
	}
	size = buf.Cap()
	if c.t.grantBudget.Add(-int64(size)) < 0 {
		c.dropGrantBuf(buf, size)
		return nil, nil, 0, false
	}
	if w, err = c.win.ws.Next(); err != nil {
		c.dropGrantBuf(buf, size)
		return nil, nil, 0, false
	}
	buf.SetLen(min(size, (n+grantRound-1)/grantRound*grantRound))
	// A grant never shows the handler another call's bytes, whatever the peer announces:
	// where the window counts what the peer's WRITEs covered (verbs.WritePrefixer: the
	// soft NIC's), onPushed clears what the peer announced and did not write, which for an
	// honest peer is nothing; elsewhere all of it is cleared here.
	if _, counted := w.MW().(verbs.WritePrefixer); !counted {
		// The response's post may just have readied the NIC engine that transmits it; on
		// a busy machine it would wait behind the zeroing (the timeline showed a 1 MiB
		// response leave 80 µs late): it goes first.
		runtime.Gosched()
		clear(buf.Bytes())
	}
	return buf, w, size, true
}

// dropGrantBuf gives back a grant's buffer and budget that were never granted.
func (c *Conn) dropGrantBuf(buf *pool.Buf, size int) {
	buf.Release()
	c.t.grantBudget.Add(int64(size))
	c.mu.Lock()
	c.grant.giving = false
	c.mu.Unlock()
}

// endGrantLocked forgets the grant given to the peer (revoked, reclaimed or torn down: see
// revoked and releaseAll; its buffer goes with its window) and returns its budget. Conn.mu
// is held.
func (c *Conn) endGrantLocked() {
	if c.grant.out != 0 {
		c.t.grantBudget.Add(int64(c.grant.outLen))
		c.t.grants.Add(-1)
		c.grant.out, c.grant.outLen = 0, 0
	}
}

// onGrant records a grant the peer gave: it replaces any before it.
func (c *Conn) onGrant(h *wire.Header) {
	c.mu.Lock()
	c.grant.in = peerGrant{addr: h.Addr, rkey: h.RKey, n: h.Len, at: time.Now()}
	c.mu.Unlock()
}

// takePeerGrant takes the peer's grant for a request of n bytes, if it has one that fits
// and is young enough to use.
func (c *Conn) takePeerGrant(n int) (peerGrant, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.grant.in
	if g.rkey == 0 {
		return peerGrant{}, false
	}
	c.grant.in = peerGrant{}
	if time.Since(g.at) >= c.t.cfg.Lease/2 {
		return peerGrant{}, false // the server's lease may reclaim it under our WRITE
	}
	if uint64(n) > uint64(g.n) {
		// Too small: given back with the SEND about to carry this request (a pending
		// revocation rides on it), so that the server may grant one that fits after its
		// response, rather than hold this one for a lease.
		c.out.pendingInv = append(c.out.pendingInv, pendingInv{rkey: g.rkey, since: g.at})
		return peerGrant{}, false
	}
	return g, true
}

// sendPushed writes the request buf into the peer's grant g and announces it (h) in the
// SEND_WITH_INV that revokes g. buf is bound to a window of ours that grants the server
// REMOTE_WRITE, for the response (written.go); the binding owns buf from then on, as in
// sendLarge. errLate: g grew too old while send waited, and nothing was posted.
func (c *Conn) sendPushed(ctx context.Context, h *wire.Header, buf *pool.Buf, g peerGrant, w *pool.Window) error {
	bind, err := c.win.ws.BindBufWR(w, buf, verbs.AccessRemoteWrite, wrid(wrBind, c.id, w.Index()))
	if err != nil { // the binding was not recorded: buf is still ours
		_ = c.win.ws.Cancel(w)
		buf.Release()
		return fmt.Errorf("mwrpc: %w", err)
	}
	rkey := w.RKey()
	h.Flags, h.Len, h.RKey, h.Addr = wire.FlagPushed|wire.FlagWritable, uint32(buf.Len()), rkey, buf.Addr()
	i := w.Index()
	c.mu.Lock()
	if c.win.pushSGE == nil {
		c.win.pushSGE = make([]verbs.SGE, c.win.ws.Len())
	}
	sge := c.win.pushSGE[i : i+1 : i+1]
	alone := c.loneLocked(true)
	c.mu.Unlock()
	if alone {
		c.peerCopies(buf.Len())
	}
	sge[0] = buf.SGE()
	pre := [2]verbs.SendWR{bind, {WRID: wrid(wrPush, c.id, i), Opcode: verbs.WRRDMAWrite,
		SGL: sge, RemoteAddr: g.addr, RKey: g.rkey}}
	wrs := pre[:]
	if c.t.testHookPushUnwritten.Load() {
		wrs = pre[:1]
	}
	probe.Mark(probe.Bind)
	c.win.ws.Hold(w)
	posted, err := c.send(ctx, h, nil, wrs, revoke{g.rkey, g.at}, sendWait)
	if posted {
		c.win.ws.Announced(w, rkey)
		c.t.counters.bound.Add(1)
		c.t.counters.pushed.Add(1)
		return nil
	}
	c.mu.Lock() // as in sendLarge: we take the binding back, or teardown releases it
	mine := !c.torn.Load()
	if mine {
		_ = c.win.ws.Cancel(w)
	}
	c.mu.Unlock()
	if mine && errors.Is(err, errLate) {
		h.Flags, h.Len, h.RKey, h.Addr = 0, 0, 0, 0
		return c.sendLarge(ctx, h, buf, revoke{}, sendWait) // a window to READ, as without a grant
	}
	if mine {
		buf.Release()
	}
	return err
}

// onPushed takes a written request: the SEND_WITH_INV that announces it revokes the grant
// the peer wrote it into, whose buffer becomes the request's.
func (c *Conn) onPushed(h *wire.Header, wc *verbs.WorkCompletion) {
	// A grant is write-only: one that allowed more is not ours.
	buf, ok := c.writtenInto(h, wc, "request", "grant", func(a verbs.Access) bool { return a == verbs.AccessRemoteWrite }, true)
	if !ok {
		return // failed the connection
	}
	c.t.counters.pushedIn.Add(1)
	c.dispatch(h, buf.Bytes(), -1, buf, time.Now()) // the response revokes the caller's window
}
