package rpc

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/transport"
)

// laneThreshold is the calls in flight per lane past which an adaptive endpoint opens
// another lane: one connection's reader, engine and socket are the queue every call of
// the lane waits in, and from a couple of calls on a second one runs beside it (one
// Client per caller, 16 connections, was 2-3x one connection at 16 callers on 16 cores).
const laneThreshold = 2

// lanes are the connections of one endpoint beyond its first (endpoint.conn), over which
// calls and streams are spread at random. The first connection is the endpoint's: its
// maintainer dials it, pings it, watches its health and its GOAWAY, and the endpoint is
// up while it is. The other lanes follow it: a lane maintainer per endpoint dials them,
// redials one that fails, drops one the server sends GOAWAY to (an adaptive endpoint
// opens it again when the load asks), and when the endpoint is removed closes them once
// its calls are done. Every lane is a connection of the Client's transport: it shares
// the registered pool, and counts against every limit and counter a connection does.
type lanes struct {
	conns  atomic.Pointer[[]*transport.Conn] // immutable, replaced whole under mu
	mu     sync.Mutex
	want   atomic.Int32  // lanes beyond the first the endpoint should have
	max    int32         // the most lanes in all (WithLanes, or GOMAXPROCS)
	pinned bool          // WithLanes: want stays max-1
	kick   chan struct{} // wakes the lane maintainer (one token)
}

// init sets the lane count: n pinned by WithLanes, or adaptive (0), up to GOMAXPROCS.
func (ls *lanes) init(n int) {
	ls.kick = make(chan struct{}, 1)
	ls.conns.Store(new([]*transport.Conn))
	ls.max, ls.pinned = int32(max(runtime.GOMAXPROCS(0), 1)), n > 0
	if ls.pinned {
		ls.max = int32(n)
		ls.want.Store(ls.max - 1)
	}
}

func (ls *lanes) wake() {
	select {
	case ls.kick <- struct{}{}:
	default:
	}
}

func (ls *lanes) add(conn *transport.Conn) {
	ls.mu.Lock()
	s := append(slices.Clone(*ls.conns.Load()), conn)
	ls.conns.Store(&s)
	ls.mu.Unlock()
}

// remove takes conn out of the lanes and reports whether it was there.
func (ls *lanes) remove(conn *transport.Conn) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	old := *ls.conns.Load()
	s := slices.DeleteFunc(slices.Clone(old), func(c *transport.Conn) bool { return c == conn })
	ls.conns.Store(&s)
	return len(s) < len(old)
}

// lane returns the connection a call on ep takes: a lane drawn at random, the endpoint's
// own connection among them. The draw uses the runtime's per-thread generator: a round
// robin counter was one more cache line every call of every caller wrote. An adaptive endpoint whose calls in flight pass
// laneThreshold per lane asks its maintainer for one more lane, up to its cap.
func (c *Client) lane(ep *endpoint, first *transport.Conn) *transport.Conn {
	ls := &ep.lanes
	extra := *ls.conns.Load()
	n := int32(len(extra))
	if !ls.pinned && n+1 < ls.max && ep.outstanding.Load() > int64(laneThreshold*(n+1)) &&
		ls.want.CompareAndSwap(n, n+1) { // one dial at a time: want stays ahead until it ends
		ls.wake()
	}
	if n == 0 {
		return first
	}
	i := rand.Uint32N(uint32(n + 1))
	if i == uint32(n) {
		return first
	}
	if l := extra[i]; l.Err() == nil {
		return l
	}
	return first // failed: its watcher is taking it out
}

// maintainLanes keeps ep's lanes at what it wants: it dials one at a time with the
// reconnection backoff after a failure (an adaptive endpoint gives up the lane it asked
// for then, and may ask again after the backoff), and when ep is removed or the client
// closes, it retires them.
func (c *Client) maintainLanes(ep *endpoint) {
	defer c.wg.Done()
	ls := &ep.lanes
	backoff := c.opts.backoffBase
	for {
		for int32(len(*ls.conns.Load())) < ls.want.Load() && ep.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(ep.ctx, 10*time.Second)
			conn, err := c.tr.Dial(ctx, ep.addr)
			cancel()
			if err == nil {
				backoff = c.opts.backoffBase
				ls.add(conn)
				c.wg.Add(1)
				go c.watchLane(ep, conn)
				continue
			}
			if !ls.pinned {
				ls.want.Store(int32(len(*ls.conns.Load())))
			}
			select {
			case <-time.After(backoff/2 + rand.N(backoff/2+1)):
			case <-ep.ctx.Done():
			}
			backoff = min(2*backoff, c.opts.backoffMax)
		}
		select {
		case <-ls.kick:
		case <-ep.ctx.Done():
			c.retireLanes(ep)
			return
		}
	}
}

// watchLane takes conn out of ep's lanes when it fails (the maintainer redials it) or
// the server sends it GOAWAY (then it finishes its calls and closes; a pinned endpoint
// redials it, an adaptive one opens a lane again when the load asks).
func (c *Client) watchLane(ep *endpoint, conn *transport.Conn) {
	defer c.wg.Done()
	ls := &ep.lanes
	select {
	case <-ep.ctx.Done():
		return // retireLanes closes it
	case <-conn.Done():
		if ls.remove(conn) {
			ls.wake()
		}
	case <-conn.GoingAway():
		if !ls.remove(conn) {
			return
		}
		if !ls.pinned {
			ls.want.Add(-1)
		}
		ls.wake()
		c.drainClose(conn)
	}
}

// drainClose closes conn once the calls in flight on it are done, or at once when the
// client closes.
func (c *Client) drainClose(conn *transport.Conn) {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for conn.InFlight() > 0 && conn.Err() == nil {
		select {
		case <-c.closed:
			return // Close closes the transport and so every connection
		case <-tick.C:
		}
	}
	_ = conn.Close()
}

// retireLanes ends a removed endpoint's lanes: no new call takes them, the calls they
// have finish, then they close. A closing client closes them at once.
func (c *Client) retireLanes(ep *endpoint) {
	ls := &ep.lanes
	ls.mu.Lock()
	old := *ls.conns.Load()
	ls.conns.Store(new([]*transport.Conn))
	ls.mu.Unlock()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	// outstanding counts the calls between connFor and their end: a call that took a
	// lane before it was taken out is counted until it ends.
	for ep.outstanding.Load() > 0 {
		select {
		case <-c.closed:
			return
		case <-tick.C:
		}
	}
	for _, conn := range old {
		_ = conn.Close()
	}
}

// Lanes returns how many connections the client holds to each endpoint now (its lanes),
// in the order of the endpoints; an endpoint that is down counts its lanes still up.
func (c *Client) Lanes() []int {
	eps := *c.eps.Load()
	n := make([]int, len(eps))
	for i, ep := range eps {
		n[i] = len(*ep.lanes.conns.Load())
		if ep.conn.Load() != nil {
			n[i]++
		}
	}
	return n
}
