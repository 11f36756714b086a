package mwnet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// network is what Addr.Network and net.OpError name.
const network = "mwnet"

// Addr is an mwnet address: a target ("host:port" or "shm:///path/to.sock").
type Addr string

// Network returns "mwnet".
func (Addr) Network() string { return network }

// String returns the target.
func (a Addr) String() string { return string(a) }

// Backlog bounds the streams waiting for Accept, as a TCP listener's backlog does: each
// holds one of the transport's handlers, so a peer opening streams faster than the
// program accepts them could otherwise take them all. Beyond it, a stream is refused
// (ResourceExhausted: the dialer's first Read fails), counted and logged.
const Backlog = 128

// Listener accepts Conns: each is a stream a Dial opened on its own queue pair.
type Listener struct {
	ln      net.Listener
	tr      *transport.Transport
	ownDev  verbs.Device
	addr    Addr
	accept  chan *Conn
	done    chan struct{} // closed by Close
	served  chan struct{} // closed when the transport stops accepting
	mu      sync.Mutex
	closed  bool
	active  int // handlers holding a connection (accepted or being offered)
	waiting int // streams offered to Accept and not yet taken: at most backlog
	backlog int // Backlog (tests lower it)
	refused atomic.Uint64
	logged  time.Time // when a refusal was last logged
	logger  *slog.Logger
	trGone  bool // the transport was closed
	closeMu sync.Mutex
}

// Listen listens on target: "host:port" (TCP; the soft fabric unless WithDevice) or
// "shm:///path/to.sock" (the shm fabric: a Unix socket at that path, which must not
// exist; removed by Close).
func Listen(target string, opts ...Option) (*Listener, error) {
	var ln net.Listener
	var err error
	if path, ok := shm.ParseTarget(target); ok {
		ln, err = shm.Listen(path, shm.Config{})
	} else {
		ln, err = net.Listen("tcp", target)
	}
	if err != nil {
		return nil, fmt.Errorf("mwnet: listen %q: %w", target, err)
	}
	addr := Addr(ln.Addr().String()) // the port the system picked for ":0"
	if _, ok := shm.ParseTarget(target); ok {
		addr = Addr(target)
	}
	l, err := newListener(ln, addr, opts)
	if err != nil {
		return nil, fmt.Errorf("mwnet: listen %q: %w", target, err)
	}
	return l, nil
}

// NewListener serves mwnet on ln, a listener of the fabric's bootstrap streams (a TCP
// listener, or shm.Listen's), which it owns from now on: Close closes it.
func NewListener(ln net.Listener, opts ...Option) (*Listener, error) {
	return newListener(ln, Addr(ln.Addr().String()), opts)
}

func newListener(ln net.Listener, addr Addr, opts []Option) (*Listener, error) {
	o := collect(opts)
	l := &Listener{ln: ln, addr: addr, accept: make(chan *Conn),
		done: make(chan struct{}), served: make(chan struct{}), logger: o.config.Logger, backlog: Backlog}
	if l.logger == nil {
		l.logger = slog.Default()
	}
	dev := o.device
	if dev == nil {
		d, _ := soft.OpenTCP("mwnet-listener")
		dev, l.ownDev = d, d
	}
	var err error
	l.tr, err = transport.New(dev, transport.HandlerFunc(l.serve), o.config)
	if err != nil {
		_ = ln.Close()
		if l.ownDev != nil {
			_ = l.ownDev.Close()
		}
		return nil, err
	}
	go func() {
		defer close(l.served)
		_ = l.tr.Serve(ln) // returns once Close closed ln
	}()
	return l, nil
}

// Accept waits for the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: network, Addr: l.addr, Err: net.ErrClosed}
	}
}

// Addr returns the listener's target (with the port the system picked for ":0").
func (l *Listener) Addr() net.Addr { return l.addr }

// Close stops accepting. Accepted connections go on; the transport under them is closed
// once the last of them is closed.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return &net.OpError{Op: "close", Net: network, Addr: l.addr, Err: net.ErrClosed}
	}
	l.closed = true
	close(l.done)
	idle := l.active == 0
	l.mu.Unlock()
	err := l.ln.Close()
	<-l.served
	if idle {
		l.closeTransport()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// closeTransport closes the transport and the listener's own device, once.
func (l *Listener) closeTransport() {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.trGone {
		return
	}
	l.trGone = true
	_ = l.tr.Close()
	if l.ownDev != nil {
		_ = l.ownDev.Close()
	}
}

// Stats returns the counters of the transport under the listener's connections (SENDs,
// stream acks, windows bound, READs: transport.Stats), for a metrics collector.
func (l *Listener) Stats() transport.Stats { return l.tr.Stats() }

// Refused returns how many streams were refused because Backlog streams waited for
// Accept already.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// enter counts a handler holding a connection, waiting for Accept. It returns the status
// to refuse the stream with, or StatusOK.
func (l *Listener) enter(peer net.Addr) transport.Code {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return transport.StatusUnavailable
	}
	if l.waiting >= l.backlog {
		l.refused.Add(1)
		if now := time.Now(); now.Sub(l.logged) > time.Second { // at most one line a second
			l.logged = now
			l.logger.Warn("mwnet: stream refused: backlog full", "peer", peer, "backlog", l.backlog, "refused", l.refused.Load())
		}
		return transport.StatusResourceExhausted
	}
	l.active++
	l.waiting++
	return transport.StatusOK
}

// taken uncounts a stream that no longer waits for Accept.
func (l *Listener) taken() {
	l.mu.Lock()
	l.waiting--
	l.mu.Unlock()
}

// leave uncounts one; the last one after Close closes the transport, from a goroutine of
// its own (Transport.Close waits for running handlers, this one among them).
func (l *Listener) leave() {
	l.mu.Lock()
	l.active--
	last := l.closed && l.active == 0
	l.mu.Unlock()
	if last {
		go l.closeTransport()
	}
}

// serve is the transport's handler: a stream becomes a Conn, offered to Accept, and the
// handler holds it (its stream lives until the handler returns) until the Conn is closed.
func (l *Listener) serve(ctx context.Context, _ []byte, w *transport.ResponseWriter) {
	st := w.Stream()
	if st == nil {
		_ = w.Write(transport.StatusUnimplemented, []byte("mwnet: only streams are served here"))
		return
	}
	switch code := l.enter(w.Peer().Addr); code {
	case transport.StatusOK:
	case transport.StatusResourceExhausted:
		_ = w.Write(code, []byte("mwnet: listener backlog full"))
		return
	default:
		_ = w.Write(code, []byte("mwnet: listener closed"))
		return
	}
	defer l.leave()
	c := newConn(st, false, l.addr, w.Peer())
	select {
	case l.accept <- c:
		l.taken()
	case <-l.done:
		l.taken()
		_ = c.Close()
		_ = w.Write(transport.StatusUnavailable, []byte("mwnet: listener closed"))
		return
	case <-ctx.Done(): // the dialer gave up before Accept took it
		l.taken()
		_ = c.Close()
		return
	}
	<-c.released
	_ = w.Write(transport.StatusOK, nil) // ends the stream: the opener reads io.EOF
}
