package rpc

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// laneThreshold is the calls in flight per lane past which an adaptive endpoint opens
// another lane: one connection's reader, engine and socket are the queue every call of
// the lane waits in, and from a couple of calls on a second one runs beside it (one
// Client per caller, 16 connections, was 2-3x one connection at 16 callers on 16 cores).
const laneThreshold = 2

// lanes are the connections of one endpoint beyond its first (endpoint.conn), which take
// calls and streams while the endpoint has more than laneThreshold in flight (Client.lane).
// The first connection is the endpoint's: its
// maintainer dials it, pings it, watches its health and its GOAWAY, and the endpoint is
// up while it is. The other lanes follow it: a lane maintainer per endpoint dials them,
// redials one that fails, drops one the server sends GOAWAY to (an adaptive endpoint
// opens it again when the load asks), and when the endpoint is removed closes them once
// its calls are done. Every lane is a connection of the Client's transport: it shares
// the registered pool, and counts against every limit and counter a connection does.
type lanes struct {
	conns   atomic.Pointer[[]*transport.Conn] // immutable, replaced whole under mu
	mu      sync.Mutex
	want    atomic.Int32  // lanes beyond the first the endpoint should have
	max     int32         // the most lanes in all (WithLanes, or GOMAXPROCS)
	byCalls int32         // the most lanes calls in flight open (max; over shm shmCallLanes)
	pinned  bool          // WithLanes: want stays max-1
	byBytes bool          // adaptive over the shm fabric: the bytes in flight open lanes too (busy)
	kick    chan struct{} // wakes the lane maintainer (one token)
}

// init sets the lane count of an endpoint at addr: n pinned by WithLanes, or adaptive
// (0), up to GOMAXPROCS.
func (ls *lanes) init(n int, addr string) {
	ls.kick = make(chan struct{}, 1)
	ls.conns.Store(new([]*transport.Conn))
	procs := int32(max(runtime.GOMAXPROCS(0), 1))
	ls.max, ls.byCalls, ls.pinned = procs, procs, n > 0
	if ls.pinned {
		ls.max = int32(n)
		ls.want.Store(ls.max - 1)
	}
	_, onSHM := shm.ParseTarget(addr)
	ls.byBytes = onSHM && !ls.pinned
	if ls.byBytes {
		ls.byCalls = shmCallLanes(procs)
	}
}

// busy reports whether an adaptive endpoint with n+1 lanes asks for another: while its
// calls in flight pass laneThreshold a lane, up to byCalls lanes, or over the shm fabric
// while the bytes they carry (calls in flight times a recent call's bytes) pass
// shmLaneBytes a lane.
func (ls *lanes) busy(ep *endpoint, n int32) bool {
	calls := ep.outstanding.Load()
	if n+1 < ls.byCalls && calls > int64(laneThreshold*(n+1)) {
		return true
	}
	return ls.byBytes && calls*ep.callBytes.Load() > shmLaneBytes*int64(n+1)
}

// shmCallLanes is the most lanes calls in flight open over the shm fabric for a client of
// procs Ps: half of them. A lane there is a pair of rings with a polling reader on each
// side; its calls share the connection's lock and its reader, so on many cores one lane is
// the queue every call waits in, and each lane more is a reader more on each side (of a
// process's readers, half of GOMAXPROCS poll at once: shm's pollGroup).
// Two processes on 16 cores, 8 Ps each (2026-11-28, 67b94e9, one run; lanes pinned), 64 B
// calls at 16 and 64 callers: one lane 205k and 223k calls/s, two 349k and 399k, four
// 535k and 634k, eight 360k and 524k (the server's CPU per call 8.6 -> 18.5 µs at 16
// callers: eight readers polling on eight Ps); 4 KiB: 183k, 283k, 421k, 302k at 16
// callers. On 2 cores half is one lane, which shmLaneBytes's measurement there chose.
func shmCallLanes(procs int32) int32 { return max(procs/2, 1) }

// shmLaneBytes is the bytes in flight per lane past which an adaptive endpoint over the
// shm fabric opens another lane. A lane there is a pair of rings with a polling reader on
// each side, not a socket whose reader and writes every call queues on: one pair carries
// all the callers' small frames, read in batches, and each lane more is a reader more
// polling on each side and smaller batches; but a lane's large copies (a READ or WRITE
// there is a copy by the side that owns the memory) are made one at a time, and more
// lanes make them side by side. Two processes on 2 cores (2026-11-27, four alternating
// pairs, one lane against the two the calls-in-flight policy opened): 2.20x the calls at
// 64 B and 16 callers and 1.60x at 64, at half the CPU per call; 1.75x at 4 KiB c16 and
// 1.41x at 64 KiB c16 (2.65x and 2.14x lent); but lent 1 MiB calls at 16 and 64 callers
// 0.83x and 0.76x. 4 MiB opens no lane for 64 KiB at 16 callers (2 MiB in flight; their
// calls in flight open up to shmCallLanes) and gives 1 MiB at 16 callers (32 MiB) all
// the lanes GOMAXPROCS allows.
const shmLaneBytes = 4 << 20

// noteCallBytes records n, the request and response bytes of a call that ended, as a
// recent call's (ep.callBytes) when it differs from the one recorded by more than 2x:
// most calls leave the endpoint's line unwritten.
func (ep *endpoint) noteCallBytes(n int) {
	if old := ep.callBytes.Load(); int64(n) > 2*old || 2*int64(n) < old {
		ep.callBytes.Store(int64(n))
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

// take takes a lane that is up and not sent GOAWAY out of the lanes, and returns it; nil
// if there is none. The endpoint's connection was lost: a lane takes its place (its
// watchLane then finds it gone and leaves it to the endpoint's maintainer).
func (ls *lanes) take() *transport.Conn {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	old := *ls.conns.Load()
	for i, conn := range old {
		select {
		case <-conn.GoingAway():
			continue
		default:
		}
		if conn.Err() != nil {
			continue
		}
		s := slices.Delete(slices.Clone(old), i, i+1)
		ls.conns.Store(&s)
		return conn
	}
	return nil
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

// lane returns the connection a call on ep takes: the endpoint's own connection while the
// endpoint has at most laneThreshold calls in flight (this one counted), else a lane drawn
// at random, the endpoint's own among them. The other lanes idle while the load is light,
// their readers asleep: drawn at every call, each lane of two over shm saw its answers two
// calls apart on average and more at times, longer than its reader's spin fits, and one
// caller's 64 B call took 56-78 µs where one lane takes 3 (two processes on 2 cores);
// adaptive lanes, once opened by a burst, stay. Under load every call draws: a first lane
// kept while it alone had fewer than two calls in flight became a fast lane that the
// callers it had just answered took again and again (p50 5 µs, p99 3.9 ms at 64 callers
// over two lanes). The draw uses the runtime's per-thread generator: a round robin
// counter was one more cache line every call of every caller wrote. An adaptive
// endpoint that is busy (past laneThreshold calls, or over shm shmLaneBytes, in flight
// per lane) asks its maintainer for one more lane, up to its cap.
func (c *Client) lane(ep *endpoint, first *transport.Conn) *transport.Conn {
	ls := &ep.lanes
	extra := *ls.conns.Load()
	n := int32(len(extra))
	if !ls.pinned && n+1 < ls.max && ls.busy(ep, n) &&
		ls.want.CompareAndSwap(n, n+1) { // one dial at a time: want stays ahead until it ends
		ls.wake()
	}
	if n == 0 || ep.outstanding.Load() <= laneThreshold {
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
// closes, it retires them. It dials only while the endpoint's own connection is up
// (connected wakes it): against a server that limits the connections from a host, lanes
// dialed beside the first could take every place and leave the endpoint down for good,
// its lanes up and unused.
func (c *Client) maintainLanes(ep *endpoint) {
	defer c.wg.Done()
	ls := &ep.lanes
	backoff := c.opts.backoffBase
	for {
		for int32(len(*ls.conns.Load())) < ls.want.Load() && ep.conn.Load() != nil && ep.ctx.Err() == nil {
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
			wait := backoff/2 + rand.N(backoff/2+1)
			// At Debug, as the endpoint's own retries: a server at its per-host limit
			// refuses a pinned count's extra lanes at every try (and logs and counts it).
			c.logger().Debug("mwrpc: dialing a lane failed; retrying", slog.String("address", ep.addr), slog.Any("error", err), slog.Duration("retry_in", wait))
			select {
			case <-time.After(wait):
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

// drainClose closes conn, sent GOAWAY and no longer picked, once the calls in flight on
// it are done, or at once when the client closes. A call picked just before that may come
// after the close: nothing of it was sent, and it goes on another connection (resend).
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
