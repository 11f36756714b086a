package bench

import (
	"errors"
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

// netrpcInstance is a net/rpc server and one *rpc.Client (one TCP connection, gob) that
// all workers share.
type netrpcInstance struct {
	ln     net.Listener
	conns  sync.WaitGroup
	client *rpc.Client
	req    []byte
	out    [][]byte // per worker: gob decodes into the slice's existing capacity
}

func openNetRPC(size, concurrency int) (Instance, error) {
	srv := rpc.NewServer()
	if err := srv.RegisterName("Bench", netrpcEcho{}); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n := &netrpcInstance{ln: ln, req: payload(size), out: make([][]byte, concurrency)}
	n.conns.Add(1)
	go func() {
		defer n.conns.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.conns.Add(1)
			go func() {
				defer n.conns.Done()
				srv.ServeConn(c) // returns when the client closes its end
			}()
		}
	}()
	if n.client, err = rpc.Dial("tcp", ln.Addr().String()); err != nil {
		_ = ln.Close()
		n.conns.Wait()
		return nil, err
	}
	return n, nil
}

func (n *netrpcInstance) Call(w int) error {
	if err := n.client.Call("Bench.Echo", n.req, &n.out[w]); err != nil {
		return err
	}
	return checkLen("netrpc", len(n.out[w]), len(n.req))
}

func (n *netrpcInstance) Copied() (uint64, bool) { return 0, false }

func (n *netrpcInstance) Close() error {
	err := errors.Join(n.client.Close(), n.ln.Close())
	n.conns.Wait()
	return err
}
