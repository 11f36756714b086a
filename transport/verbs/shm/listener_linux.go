package shm

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener accepts shm connections on a Unix socket.
type Listener struct {
	ln   *net.UnixListener
	cfg  Config
	addr *Addr

	refused atomic.Int64
	logMu   sync.Mutex
	logged  time.Time // when a refusal was last logged
	quiet   int64     // refusals not logged since
}

var _ net.Listener = (*Listener)(nil)

// Listen listens at the Unix socket path (which must not exist; Close removes it).
func Listen(path string, cfg Config) (*Listener, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("shm: listen %s: %w", path, err)
	}
	return &Listener{ln: ln, cfg: cfg, addr: &Addr{Path: path}}, nil
}

// Accept returns the next connection whose peer runs as an allowed user; the others are
// closed, counted (Refused) and logged, at most once a second. The connection's setup (the
// hellos) runs on its first Read or Write, within its deadline or Config.HandshakeTimeout,
// so that a slow peer does not hold up Accept.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		uc, err := l.ln.AcceptUnix()
		if err != nil {
			return nil, err
		}
		remote, err := checkPeer(uc, l.addr.Path, l.cfg)
		if err != nil {
			_ = uc.Close()
			l.refuse(err)
			continue
		}
		return newConn(uc, l.cfg, l.addr, remote, &acceptedReaders), nil
	}
}

func (l *Listener) refuse(err error) {
	l.refused.Add(1)
	l.logMu.Lock()
	defer l.logMu.Unlock()
	if time.Since(l.logged) < time.Second {
		l.quiet++
		return
	}
	log := slog.Default()
	if errors.Is(err, ErrCredentials) {
		log.Warn("mwrpc: shm connection refused", "err", err, "not_logged_since", l.quiet)
	} else {
		log.Warn("mwrpc: shm connection failed before setup", "err", err, "not_logged_since", l.quiet)
	}
	l.logged, l.quiet = time.Now(), 0
}

// Refused returns how many connections Accept has turned away.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// Close stops listening and removes the socket file.
func (l *Listener) Close() error { return l.ln.Close() }

// Addr returns the socket's address as an shm target.
func (l *Listener) Addr() net.Addr { return l.addr }
