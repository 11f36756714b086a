package bench

import (
	"fmt"
	"net"
	"net/rpc"
	"sync"
)

// netrpcEcho is the net/rpc service: net/rpc's method shape, the same echo.
type netrpcEcho struct{}

// Echo sets the reply to the arguments.
func (netrpcEcho) Echo(args []byte, reply *[]byte) error {
	*reply = args
	return nil
}

// netrpcServer is a net/rpc server, one goroutine per connection.
type netrpcServer struct {
	ln    net.Listener
	conns sync.WaitGroup
	mu    sync.Mutex
	open  map[net.Conn]bool
}

func serveNetRPC(ln net.Listener) (Server, error) {
	srv := rpc.NewServer()
	if err := srv.RegisterName("Bench", netrpcEcho{}); err != nil {
		return nil, fmt.Errorf("net/rpc register: %w", err)
	}
	n := &netrpcServer{ln: ln, open: map[net.Conn]bool{}}
	n.conns.Add(1)
	go func() {
		defer n.conns.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.track(c, true)
			n.conns.Add(1)
			go func() {
				defer n.conns.Done()
				defer n.track(c, false)
				srv.ServeConn(c) // returns when the client closes its end (or Close closes c)
			}()
		}
	}()
	return n, nil
}

func (n *netrpcServer) track(c net.Conn, open bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if open {
		n.open[c] = true
	} else {
		delete(n.open, c)
	}
}

func (n *netrpcServer) Copied() (uint64, bool) { return 0, false }

// Close closes the listener and every connection still open, and waits for their
// goroutines.
func (n *netrpcServer) Close() error {
	err := n.ln.Close()
	n.mu.Lock()
	for c := range n.open {
		_ = c.Close()
	}
	n.mu.Unlock()
	n.conns.Wait()
	return err
}

// netrpcInstance is one *rpc.Client (one TCP connection, gob) that all workers share.
type netrpcInstance struct {
	client *rpc.Client
	req    []byte
	out    [][]byte // per worker: gob decodes into the slice's existing capacity
}

func dialNetRPC(addr string, size, concurrency int) (Instance, error) {
	client, err := rpc.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("net/rpc dial: %w", err)
	}
	return &netrpcInstance{client: client, req: payload(size), out: make([][]byte, concurrency)}, nil
}

func (n *netrpcInstance) Call(w int) error {
	if err := n.client.Call("Bench.Echo", n.req, &n.out[w]); err != nil {
		return err
	}
	return checkLen("netrpc", len(n.out[w]), len(n.req))
}

func (n *netrpcInstance) Copied() (uint64, bool) { return 0, false }

func (n *netrpcInstance) Close() error { return n.client.Close() }
