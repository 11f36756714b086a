package transport

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// event is a kind of thing a peer makes happen that an operator should hear of: each has
// a counter in Stats and a rate-limited log line, so that an attack is visible without
// flooding the log.
type event uint8

const (
	evRefused    event = iota // Serve turned a connection away (MaxConns, MaxConnsPerHost)
	evSetup                   // a connection's setup failed (hello, TLS, timeout)
	evProtocol                // the peer broke the protocol (malformed message, refused access)
	evFailed                  // a connection failed for another reason (the peer vanished...)
	evStalled                 // the peer stopped returning credits (CreditTimeout)
	evCrowded                 // a request beyond MaxCallsPerConn
	evOverloaded              // a request found every handler busy
	evPings                   // a client pinged more often than the keepalive policy allows
	numEvents
)

// Rate limit: a burst of logBurst lines per kind, then one per logEvery; what is dropped
// meanwhile is counted and reported ("suppressed") with the next line of that kind.
const (
	logBurst = 10
	logEvery = time.Second
)

// eventLog writes the rate-limited lines.
type eventLog struct {
	logger *slog.Logger
	mu     sync.Mutex
	kinds  [numEvents]struct {
		tokens     float64
		last       time.Time
		suppressed int
	}
}

// log writes msg unless its kind used up its lines; args are slog's key-value pairs.
func (l *eventLog) log(ev event, level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !l.logger.Enabled(ctx, level) {
		return
	}
	l.mu.Lock()
	k := &l.kinds[ev]
	now := time.Now()
	if k.last.IsZero() {
		k.tokens = logBurst
	} else {
		k.tokens = min(logBurst, k.tokens+float64(now.Sub(k.last))/float64(logEvery))
	}
	k.last = now
	if k.tokens < 1 {
		k.suppressed++
		l.mu.Unlock()
		return
	}
	k.tokens--
	suppressed := k.suppressed
	k.suppressed = 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed) // lines like this one dropped since the last
	}
	l.logger.Log(ctx, level, msg, args...)
}
