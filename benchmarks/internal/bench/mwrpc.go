package bench

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/echo"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// mwrpcInstance is an rpc.Server serving echo.Bench and one rpc.Client calling it through
// the generated stub; all workers share the client (and so its one connection).
type mwrpcInstance struct {
	srv        *rpc.Server
	served     chan error
	client     *rpc.Client
	stub       *echo.BenchClient
	sdev, cdev *soft.Device
	req        []byte
}

func openMwrpcTCP(size, concurrency int) (Instance, error) {
	// The devices rpc.NewServer and rpc.Dial would open on their own, opened here so that
	// their copy counters can be read.
	sdev, _ := soft.OpenTCP("bench-server")
	cdev, _ := soft.OpenTCP("bench-client")
	return openMwrpc(sdev, cdev, size)
}

func openMwrpcInproc(size, concurrency int) (Instance, error) {
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
	return openMwrpc(sdev, cdev, size)
}

func openMwrpc(sdev, cdev *soft.Device, size int) (Instance, error) {
	m := &mwrpcInstance{sdev: sdev, cdev: cdev, req: payload(size), served: make(chan error, 1)}
	m.srv = rpc.NewServer(rpc.WithDevice(sdev))
	echo.RegisterBench(m.srv, echo.Server{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		m.closeDevices()
		return nil, err
	}
	go func() { m.served <- m.srv.Serve(ln) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m.client, err = rpc.Dial(ctx, ln.Addr().String(), rpc.WithClientDevice(cdev))
	if err != nil {
		m.srv.Stop()
		<-m.served
		m.closeDevices()
		return nil, err
	}
	m.stub = echo.NewBenchClient(m.client)
	return m, nil
}

func (m *mwrpcInstance) Call(int) error {
	out, err := m.stub.Echo(context.Background(), m.req)
	if err != nil {
		return err
	}
	return checkLen("mwrpc", len(out), len(m.req))
}

func (m *mwrpcInstance) Copied() (uint64, bool) {
	var n uint64
	for _, d := range []*soft.Device{m.sdev, m.cdev} {
		st := d.Stats()
		n += st.SocketTxBytes + st.SocketRxBytes + st.CopyBytes
	}
	return n, true
}

func (m *mwrpcInstance) Close() error {
	err := m.client.Close()
	m.srv.Stop()
	err = errors.Join(err, <-m.served)
	return errors.Join(err, m.closeDevices())
}

func (m *mwrpcInstance) closeDevices() error {
	return errors.Join(m.cdev.Close(), m.sdev.Close())
}
