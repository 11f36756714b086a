package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/echo"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// mwrpcServer is an rpc.Server serving echo.Bench on its own device.
type mwrpcServer struct {
	srv    *rpc.Server
	served chan error
	dev    *soft.Device
}

// mwrpcInstance is one rpc.Client calling echo.Bench through the generated stub; all
// workers share the client (and so its one connection).
type mwrpcInstance struct {
	client *rpc.Client
	stub   *echo.BenchClient
	dev    *soft.Device
	req    []byte
}

// serveMwrpcTCP serves over the soft provider's TCP fabric: what rpc.NewServer does on its
// own, with the device opened here so that its copy counters can be read.
func serveMwrpcTCP(ln net.Listener) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return serveMwrpc(dev, ln), nil
}

func serveMwrpc(dev *soft.Device, ln net.Listener) *mwrpcServer {
	s := &mwrpcServer{dev: dev, served: make(chan error, 1)}
	s.srv = rpc.NewServer(rpc.WithDevice(dev))
	echo.RegisterBench(s.srv, echo.Server{})
	go func() { s.served <- s.srv.Serve(ln) }()
	return s
}

func (s *mwrpcServer) Copied() (uint64, bool) { return devCopied(s.dev), true }

func (s *mwrpcServer) Close() error {
	s.srv.Stop()
	return errors.Join(<-s.served, s.dev.Close())
}

// dialMwrpcTCP connects over the soft provider's TCP fabric (what rpc.Dial does by default).
func dialMwrpcTCP(addr string, size, _ int) (Instance, error) {
	dev, err := soft.OpenTCP("bench-client")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return dialMwrpc(dev, addr, size)
}

func dialMwrpc(dev *soft.Device, addr string, size int) (Instance, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.Dial(ctx, addr, rpc.WithClientDevice(dev))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("rpc.Dial: %w", err), dev.Close())
	}
	return &mwrpcInstance{client: client, stub: echo.NewBenchClient(client), dev: dev, req: payload(size)}, nil
}

// openMwrpcInproc sets server and client up over one in-process fabric.
func openMwrpcInproc(size, _ int) (Instance, error) {
	fab := soft.NewFabric()
	sdev, err := fab.Open("bench-server")
	if err != nil {
		return nil, err
	}
	cdev, err := fab.Open("bench-client")
	if err != nil {
		_ = sdev.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Join(err, cdev.Close(), sdev.Close())
	}
	srv := serveMwrpc(sdev, ln)
	cli, err := dialMwrpc(cdev, ln.Addr().String(), size)
	if err != nil {
		return nil, errors.Join(err, srv.Close())
	}
	return &localInstance{Instance: cli, srv: srv}, nil
}

func (m *mwrpcInstance) Call(int) error {
	out, err := m.stub.Echo(context.Background(), m.req)
	if err != nil {
		return err
	}
	return checkLen("mwrpc", len(out), len(m.req))
}

func (m *mwrpcInstance) Copied() (uint64, bool) { return devCopied(m.dev), true }

func (m *mwrpcInstance) Close() error {
	return errors.Join(m.client.Close(), m.dev.Close())
}

// devCopied is what the soft device counts as moved or copied.
func devCopied(d *soft.Device) uint64 {
	st := d.Stats()
	return st.SocketTxBytes + st.SocketRxBytes + st.CopyBytes
}
