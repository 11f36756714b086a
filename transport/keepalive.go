package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// ServerKeepalive is a server's keepalive policy, with the semantics and defaults of
// gRPC's keepalive.ServerParameters (MaxConnectionAge, MaxConnectionAgeGrace) and
// keepalive.EnforcementPolicy (MinTime, PermitWithoutStream). A connection's idleness
// limit (gRPC's MaxConnectionIdle) is Config.IdleTimeout.
type ServerKeepalive struct {
	// MaxConnectionAge: a connection older than this, give or take 10% so that a
	// server's connections do not all go at once, is sent GOAWAY (the client moves its
	// new calls to a new connection). Zero or less: never (gRPC's default).
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long the calls in flight on a connection sent GOAWAY
	// for its age have before it is closed. Zero or less: as long as they take.
	MaxConnectionAgeGrace time.Duration
	// MinPingInterval is the least time a client may leave between its pings (gRPC's
	// MinTime): a ping sooner than that after the previous one is a strike, and so is,
	// unless PermitWithoutCalls, one sooner than two hours after the previous while no
	// call is in flight. A request from the client forgives the strikes. The third strike
	// ends the connection: the client is sent GOAWAY saying "too many pings"
	// (ErrTooManyPings), and the connection is closed a second later. Zero means
	// DefaultMinPingInterval (5 minutes, gRPC's); less than zero, pings are not limited.
	MinPingInterval time.Duration
	// PermitWithoutCalls lets a client ping every MinPingInterval also while it has no
	// call in flight on the connection (gRPC's PermitWithoutStream).
	PermitWithoutCalls bool
}

// Keepalive defaults, gRPC's.
const (
	DefaultMinPingInterval = 5 * time.Minute
	// idlePingInterval is the least time between pings with no call in flight, unless
	// PermitWithoutCalls: gRPC's defaultPingTimeout.
	idlePingInterval = 2 * time.Hour
	// maxPingStrikes is how many strikes a connection survives (gRPC's maxPingStrikes).
	maxPingStrikes = 2
	// pingAwayClose is how long a connection sent GOAWAY for its pings stays open, so
	// that the GOAWAY reaches the client before the connection ends.
	pingAwayClose = time.Second
)

// ErrTooManyPings is why a server sends GOAWAY to a client that pings more often than
// its keepalive policy allows (ServerKeepalive.MinPingInterval); the client's
// Conn.GoAwayErr wraps it. Ping less often (rpc.WithKeepalive) or have the server permit
// it.
var ErrTooManyPings = errors.New("too many pings")

// ErrMaxConnectionAge is why a server sends GOAWAY to a connection older than its
// ServerKeepalive.MaxConnectionAge.
var ErrMaxConnectionAge = errors.New("connection past the server's maximum age")

// GOAWAY reasons, in the header's Status field; 0 is a plain GOAWAY (GracefulStop,
// IdleTimeout). A peer that knows none of them sees a plain GOAWAY.
const (
	goAwayTooManyPings uint16 = 1
	goAwayMaxAge       uint16 = 2
	maxGoAwayText             = 256 // bytes of a GOAWAY's text a client keeps
)

// pingWatch is a server's view of one connection's pings and age.
type pingWatch struct {
	mu       sync.Mutex
	last     time.Time // the previous ping
	strikes  int
	requests uint64      // requests when it last pinged: one since forgives the strikes
	away     time.Time   // GOAWAY sent for pings: closed pingAwayClose later
	awaySent atomic.Bool // away is set: the poller has a connection to close
	born     time.Time   // the poller's first look at the connection
	maxAge   time.Duration
	aged     time.Time // GOAWAY sent for age
}

// onPing applies the keepalive policy to a ping the client sent: false means the client
// pinged too often and was sent GOAWAY, and is not answered.
func (c *Conn) onPing() bool {
	ka := &c.t.cfg.Keepalive
	if !c.accepted || ka.MinPingInterval < 0 {
		return true
	}
	c.mu.Lock()
	busy := c.serving.calls.len() > 0
	c.mu.Unlock()
	w := &c.pings
	now, n := time.Now(), c.requests.Load()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.away.IsZero() {
		return false
	}
	if n != w.requests {
		w.requests, w.strikes = n, 0
	}
	least := ka.MinPingInterval
	if !busy && !ka.PermitWithoutCalls {
		least = idlePingInterval
	}
	if !w.last.IsZero() && now.Sub(w.last) < least {
		w.strikes++
	}
	w.last = now
	if w.strikes <= maxPingStrikes {
		return true
	}
	w.away = now
	w.awaySent.Store(true)
	why := fmt.Sprintf("%v: this server allows a ping every %v while calls are in flight and ", ErrTooManyPings, ka.MinPingInterval)
	if ka.PermitWithoutCalls {
		why += "as often without calls"
	} else {
		why += fmt.Sprintf("every %v without", idlePingInterval)
	}
	c.queueCtrl(wire.Header{Kind: wire.KindGoAway, Status: goAwayTooManyPings}, revoke{}, why)
	c.t.counters.events[evPings].Add(1)
	c.t.events.log(evPings, slog.LevelWarn, "mwrpc: client pinged too often: GOAWAY sent, closing the connection", "peer", c.peerAddr(), "min_interval", least)
	return false
}

// keepaliveDue says whether checkKeepalive has anything to do for c.
func (c *Conn) keepaliveDue() bool {
	return c.t.cfg.Keepalive.MaxConnectionAge > 0 || c.pings.awaySent.Load()
}

// checkKeepalive runs on the poller every tick for a connection Serve accepted: it closes
// a connection a second after its GOAWAY for pings, and sends GOAWAY to one past its
// maximum age, closing it after the grace.
func (c *Conn) checkKeepalive(now time.Time) {
	ka := &c.t.cfg.Keepalive
	w := &c.pings
	w.mu.Lock()
	pingAway := !w.away.IsZero() && now.Sub(w.away) >= pingAwayClose
	if w.born.IsZero() {
		w.born = now
		if ka.MaxConnectionAge > 0 {
			w.maxAge = time.Duration(float64(ka.MaxConnectionAge) * (0.9 + 0.2*rand.Float64()))
		}
	}
	sendAged := w.maxAge > 0 && w.aged.IsZero() && now.Sub(w.born) >= w.maxAge
	if sendAged {
		w.aged = now
	}
	closeAged := !w.aged.IsZero() && ka.MaxConnectionAgeGrace > 0 && now.Sub(w.aged) >= ka.MaxConnectionAgeGrace
	w.mu.Unlock()
	switch {
	case pingAway:
		c.fail(fmt.Errorf("%w: the client pinged too often: %w", ErrUnavailable, ErrTooManyPings))
	case sendAged:
		c.queueCtrl(wire.Header{Kind: wire.KindGoAway, Status: goAwayMaxAge}, revoke{}, ErrMaxConnectionAge.Error())
	case closeAged:
		c.fail(fmt.Errorf("%w: %w, and its grace of %v passed", ErrUnavailable, ErrMaxConnectionAge, ka.MaxConnectionAgeGrace))
	}
}

// onGoAway records why the peer sent GOAWAY (GoAwayErr) and tells GoingAway.
func (c *Conn) onGoAway(h *wire.Header, payload []byte) {
	var reason error
	switch h.Status {
	case goAwayTooManyPings:
		reason = ErrTooManyPings
	case goAwayMaxAge:
		reason = ErrMaxConnectionAge
	}
	c.goAway.Do(func() {
		if reason != nil {
			text := payload[:min(len(payload), maxGoAwayText)]
			c.awayErr = fmt.Errorf("mwrpc: the server sent GOAWAY: %w (%q)", reason, text)
		}
		close(c.awayCh)
	})
}

// GoAwayErr says why the peer sent GOAWAY, once GoingAway is closed: an error wrapping
// ErrTooManyPings or ErrMaxConnectionAge with the server's own words, or nil for a plain
// GOAWAY (a server stopping gracefully, an idle connection).
func (c *Conn) GoAwayErr() error {
	select {
	case <-c.awayCh:
		return c.awayErr
	default:
		return nil
	}
}
