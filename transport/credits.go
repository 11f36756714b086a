package transport

import (
	"context"
	"time"

	"github.com/mwrpc/mwrpc/internal/probe"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// The credit gate. A side sends a counted message only on a credit: one of the receive
// slots the peer posted for it (Config.Credits, the smaller of both sides' offers), given
// back in the header of the peer's messages or in a Release once the peer reposted them.
// send takes a credit and a send slot under c.mu (the slot and its registered buffer are
// made on first use and live with the connection); onSent frees the slot when its SEND
// completes. The poller never waits for a credit: what it must send (pongs, cancels, the
// answers it gives itself, window revocations) is queued and flushed by flushCtrl as
// credits come back, Releases on control credits of their own. A handler's response waits
// at most CreditTimeout, or not at all on a credit reserved before it ran (inline).

// Release messages carry credits and window revocations and consume no credit themselves
// (so that returning credits never needs one): they go to recvCtrlSlots receives of their
// own, posted next to the counted ones, and spend control credits, which the receiver
// returns in header byte 3 once it has reposted those slots. So a release never finds the
// peer without a receive posted (no RNR). A side keeps its last control credit for a
// release that returns control credits: then two sides that owe each other cannot both be
// out of them. A side returns control credits alone once it owes ctrlThreshold of them.
const (
	recvCtrlSlots = 32
	ctrlThreshold = recvCtrlSlots / 2
)

type pendingInv struct {
	rkey  uint32
	since time.Time // when the window's header arrived
}

// ctrlMsg is a counted message the poller queues: a pong, a cancel, an answer it gives
// without a handler (with a short text).
type ctrlMsg struct {
	h   wire.Header
	rv  revoke
	msg []byte
}

// revoke names a peer window a SEND_WITH_INV revokes, and when it was announced: the
// revocation is sent only within half the lease of that (see popInvLocked).
type revoke struct {
	rkey uint32
	at   time.Time
}

func grantedCredits(cfg *Config, peer wire.Hello) int {
	return min(int(peer.Credits), cfg.Credits)
}

// owe counts a receive reposted for the peer, and returns credits when enough are owed.
func (c *Conn) owe(counted bool) {
	if counted && c.out.owed.Add(1) >= c.creditThreshold() || !counted && c.out.owedCtrl.Add(1) >= ctrlThreshold {
		c.returnCredits()
	}
}

// creditThreshold is how many reposted slots are worth a Release of their own.
func (c *Conn) creditThreshold() int32 { return int32(max(1, c.t.cfg.Credits/8)) }

// owesCredits reports whether enough reposted slots of either kind wait to be announced
// to be worth a release of their own.
func (c *Conn) owesCredits() bool {
	return c.out.owed.Load() >= c.creditThreshold() || c.out.owedCtrl.Load() >= ctrlThreshold
}

// returnCredits announces reposted slots in a Release, which needs no credit.
func (c *Conn) returnCredits() {
	h := wire.Header{Kind: wire.KindRelease}
	_, _ = c.send(context.Background(), &h, nil, nil, revoke{}, sendControl)
}

// reserveCredit takes a credit for a response ahead of its handler (InlineHandlers): it
// reports whether one was free. The response spends it with sendReserved.
func (c *Conn) reserveCredit() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || !c.ready.Load() || c.out.avail == 0 {
		return false
	}
	c.out.avail--
	return true
}

// queueInv records a peer window to revoke: on our next SEND, or alone when the poller is
// next idle.
func (c *Conn) queueInv(rkey uint32, since time.Time) {
	c.mu.Lock()
	c.out.pendingInv = append(c.out.pendingInv, pendingInv{rkey: rkey, since: since})
	mark := !c.out.dirty
	c.out.dirty = true
	c.mu.Unlock()
	if mark {
		c.p.markDirty(c)
	}
}

// queueCtrl queues a counted message the poller sends when it can (a pong, a cancel, an
// overload answer): the poller never waits for a credit.
func (c *Conn) queueCtrl(h wire.Header, inv revoke, msg ...string) {
	m := ctrlMsg{h: h, rv: inv}
	if len(msg) > 0 {
		m.msg = []byte(msg[0])
	}
	c.mu.Lock()
	c.out.ctrl = append(c.out.ctrl, m)
	mark := !c.out.dirty
	c.out.dirty = true
	c.mu.Unlock()
	if mark {
		c.p.markDirty(c)
	}
}

// flushCtrl sends what queueCtrl and queueInv queued, as far as credits allow.
func (c *Conn) flushCtrl() {
	probe.Mark(probe.FlushCtrl)
	if c.ready.Load() {
		c.postUnposted()
	}
	for {
		c.mu.Lock()
		c.out.dirty = false
		if c.err != nil || len(c.out.ctrl) == 0 {
			c.mu.Unlock()
			break
		}
		m := c.out.ctrl[0]
		c.mu.Unlock()
		if _, err := c.send(bg, &m.h, m.msg, nil, m.rv, sendTry); err != nil {
			break // no credit: the next credit arrival flushes again; Releases need none
		}
		c.mu.Lock()
		c.out.ctrl = c.out.ctrl[1:]
		c.mu.Unlock()
	}
	for {
		c.mu.Lock()
		n := len(c.out.pendingInv)
		c.mu.Unlock()
		if n == 0 && !c.owesCredits() {
			return
		}
		h := wire.Header{Kind: wire.KindRelease} // carries a revocation and the owed credits
		if _, err := c.send(bg, &h, nil, nil, revoke{}, sendControl); err != nil {
			c.mu.Lock()
			c.out.stalled = true // no control credit or send slot: their return flushes again
			c.mu.Unlock()
			return
		}
	}
}
