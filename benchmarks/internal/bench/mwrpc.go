package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"runtime"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/echo"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/credentials"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// mwrpcServer is an rpc.Server serving echo.Bench on its own device (a soft one, or an
// RDMA device in the ibverbs build: mwrpc_ibv.go).
type mwrpcServer struct {
	srv    *rpc.Server
	served chan error
	dev    verbs.Device
}

// mwrpcInstance is one rpc.Client calling echo.Bench through the generated stub; all
// workers share the client (and so its one connection).
type mwrpcInstance struct {
	client *rpc.Client
	stub   *echo.BenchClient
	dev    verbs.Device
	req    []byte
	lent   bool // mwrpc-lent: requests in Client.Buffer's memory, responses lent
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

// benchBusyPoll is the busy polling of mwrpc-poll and mwrpc-shm-poll
// (transport.Config.BusyPoll): about a small call's round trip on a many-core machine.
const benchBusyPoll = 50 * time.Microsecond

// serveMwrpcPoll is serveMwrpcTCP with busy polling (mwrpc-poll).
func serveMwrpcPoll(ln net.Listener) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return serveMwrpc(dev, ln, rpc.WithTransport(transport.Config{BusyPoll: benchBusyPoll})), nil
}

// dialMwrpcPoll is dialMwrpcTCP with busy polling (mwrpc-poll).
func dialMwrpcPoll(addr string, size, _ int) (Instance, error) {
	dev, err := soft.OpenTCP("bench-client")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return dialMwrpc(dev, addr, size, rpc.WithTransport(transport.Config{BusyPoll: benchBusyPoll}))
}

// serveMwrpcInline is serveMwrpcTCP with handlers run on the goroutine that reaps their
// requests (the echo handler never blocks).
func serveMwrpcInline(ln net.Listener) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return serveMwrpc(dev, ln, rpc.WithTransport(transport.Config{InlineHandlers: true})), nil
}

// serveMwrpcNoGrants is serveMwrpcTCP without grants for written requests: its callers'
// large requests are all READ from their windows.
func serveMwrpcNoGrants(ln net.Listener) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return serveMwrpc(dev, ln, rpc.WithTransport(transport.Config{GrantBytes: -1})), nil
}

// serveMwrpcPool is serveMwrpcTCP without adaptive inline handlers: every request goes to
// the handler pool, as before InlineBudget.
func serveMwrpcPool(ln net.Listener) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return serveMwrpc(dev, ln, rpc.WithTransport(transport.Config{InlineBudget: -1})), nil
}

// serveMwrpcPollers is serveMwrpcTCP with a poller (and so a completion queue and a
// shared receive queue) per four of the server's cores: the connections' completions and
// receives spread over them instead of all passing one.
func serveMwrpcPollers(ln net.Listener) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return serveMwrpc(dev, ln, rpc.WithTransport(transport.Config{Pollers: max(runtime.GOMAXPROCS(0)/4, 1)})), nil
}

// tunedSoftTCP is the transport configuration mwrpc-tuned measures (docs/tuning.md): on
// the soft TCP fabric a READ costs a round trip through the peer's CPU, so payloads up to
// 64 KiB (and the rpc envelope around them) go inside the SEND, in 66 KiB receive slots that
// the server's connections share.
var tunedSoftTCP = transport.Config{SlotSize: 66 << 10, EagerThreshold: 66<<10 - 32} // 64 KiB and the envelope

// serveMwrpcTuned is serveMwrpcTCP with tunedSoftTCP, shared receives and inline handlers.
func serveMwrpcTuned(ln net.Listener) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	cfg := tunedSoftTCP
	cfg.SharedReceives, cfg.InlineHandlers = 512, true
	return serveMwrpc(dev, ln, rpc.WithTransport(cfg)), nil
}

// dialMwrpcTuned dials serveMwrpcTuned with the same slots (responses up to 64 KiB then
// come inside the SEND too).
func dialMwrpcTuned(addr string, size, _ int) (Instance, error) {
	dev, err := soft.OpenTCP("bench-client")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	return dialMwrpc(dev, addr, size, rpc.WithTransport(tunedSoftTCP))
}

// serveMwrpcTLS is serveMwrpcTCP with the fabric's stream inside TLS 1.3 (transport
// credentials), on a self-signed certificate made at start.
func serveMwrpcTLS(ln net.Listener) (Server, error) {
	cert, err := selfSigned()
	if err != nil {
		return nil, err
	}
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})
	return serveMwrpc(dev, ln, rpc.WithTransportCredentials(creds)), nil
}

// dialMwrpcTLS dials serveMwrpcTLS. It does not verify the server's certificate: that is
// part of the handshake, which is not measured; every byte after it is encrypted as with
// a verified peer.
func dialMwrpcTLS(addr string, size, _ int) (Instance, error) {
	dev, err := soft.OpenTCP("bench-client")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	creds := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // see the doc comment
	return dialMwrpc(dev, addr, size, rpc.WithTransportCredentials(creds))
}

// selfSigned makes an ECDSA P-256 certificate for 127.0.0.1, valid for a day.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mwrpcbench"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func serveMwrpc(dev verbs.Device, ln net.Listener, opts ...rpc.ServerOption) *mwrpcServer {
	s := &mwrpcServer{dev: dev, served: make(chan error, 1)}
	s.srv = rpc.NewServer(append([]rpc.ServerOption{rpc.WithDevice(dev)}, opts...)...)
	echo.RegisterBench(s.srv, echo.Server{})
	go func() { s.served <- s.srv.Serve(ln) }()
	return s
}

func (s *mwrpcServer) Copied() (uint64, bool) { return devCopied(s.dev) }

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

func dialMwrpc(dev verbs.Device, addr string, size int, opts ...rpc.DialOption) (Instance, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.Dial(ctx, addr, append([]rpc.DialOption{rpc.WithDevice(dev)}, opts...)...)
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
	req := m.req
	if m.lent {
		// The caller builds its request in registered memory: like rawtcp, which writes
		// the same bytes every call, it does not write them again each time.
		var err error
		if req, err = m.client.Buffer(context.Background(), len(m.req)); err != nil {
			return err
		}
	}
	out, err := m.stub.Echo(context.Background(), req)
	if err != nil {
		return err
	}
	if err := checkLen("mwrpc", len(out), len(m.req)); err != nil {
		return err
	}
	if m.lent {
		return m.client.Release(out)
	}
	return nil
}

// dialMwrpcLent is dialMwrpcTCP for mwrpc-lent: each request is built in the client's
// registered memory (rpc.Client.Buffer) and each response read where the transport put it
// (rpc.WithLentResponses), so the client neither copies nor allocates per call.
// dialMwrpcLanes dials as mwrpc-tcp with the client's lanes pinned to n.
func dialMwrpcLanes(n int) func(addr string, size, _ int) (Instance, error) {
	return func(addr string, size, _ int) (Instance, error) {
		dev, err := soft.OpenTCP("bench-client")
		if err != nil {
			return nil, fmt.Errorf("soft.OpenTCP: %w", err)
		}
		return dialMwrpc(dev, addr, size, rpc.WithLanes(n))
	}
}

func dialMwrpcLent(addr string, size, _ int) (Instance, error) {
	dev, err := soft.OpenTCP("bench-client")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	inst, err := dialMwrpc(dev, addr, size, rpc.WithLentResponses())
	if err != nil {
		return nil, err
	}
	inst.(*mwrpcInstance).lent = true
	return inst, nil
}

func (m *mwrpcInstance) Copied() (uint64, bool) { return devCopied(m.dev) }

func (m *mwrpcInstance) Close() error {
	return errors.Join(m.client.Close(), m.dev.Close())
}

// devCopied is what a soft device counts as moved or copied; other devices (ibv) count
// nothing, and report false.
func devCopied(d verbs.Device) (uint64, bool) {
	sd, ok := d.(*soft.Device)
	if !ok {
		return 0, false
	}
	st := sd.Stats()
	return st.SocketTxBytes + st.SocketRxBytes + st.CopyBytes + st.PlacedBytes, true
}
