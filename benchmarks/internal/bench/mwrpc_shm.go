package bench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// The same-host systems (mwrpc-shm, shmipc-go) meet at a Unix socket, not at the TCP
// address the harness hands out. Their servers take the harness's listener (a server
// process prints its address) and keep it, unused, until they stop, and listen at a socket
// named after its port in the temporary directory, which their clients derive from the
// same address.

// sameHostSocket is the socket path of the same-host system whose harness address is addr.
func sameHostSocket(system, addr string) (string, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%s: harness address %q: %w", system, addr, err)
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("mwrpcbench-%s-%s.sock", system, port)), nil
}

// sameHostServer is a same-host system's server with the harness's listener it holds.
type sameHostServer struct {
	Server
	tcp net.Listener
}

func (s *sameHostServer) Close() error { return errors.Join(s.Server.Close(), s.tcp.Close()) }

// mwrpcSHMDesc describes mwrpc-shm.
const mwrpcSHMDesc = "mwrpc, soft provider over the shm fabric (two shared-memory rings per connection, set up through a Unix socket: same host only; lanes adaptive: over shm up to half of GOMAXPROCS for small calls), generated stub, raw codec"

// mwrpcSHMStreamDesc describes mwrpc-shm in the streaming cell.
const mwrpcSHMStreamDesc = "mwrpc-tcp's streams (the default 4 MiB stream window) over the shm fabric"

// listenSHM listens at the shm socket of the harness's listener ln.
func listenSHM(ln net.Listener, cfg shm.Config) (net.Listener, error) {
	path, err := sameHostSocket("mwrpc-shm", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	_ = os.Remove(path) // left by a server process that was killed
	return shm.Listen(path, cfg)
}

// shmTarget is the shm target of the harness's address addr.
func shmTarget(addr string) (string, error) {
	path, err := sameHostSocket("mwrpc-shm", addr)
	if err != nil {
		return "", err
	}
	return shm.Scheme + path, nil
}

func serveMwrpcSHM(ln net.Listener) (Server, error) { return serveMwrpcSHMWith(ln, transport.Config{}) }

// serveMwrpcSHMPoll is serveMwrpcSHM with busy polling (mwrpc-shm-poll).
func serveMwrpcSHMPoll(ln net.Listener) (Server, error) {
	return serveMwrpcSHMWith(ln, transport.Config{BusyPoll: benchBusyPoll})
}

// serveMwrpcSHMWith serves mwrpc over shm with the transport configuration cfg, whose
// shm settings (Config.SHM) the listener's rings take too, as rpc.Server.ListenAndServe's.
func serveMwrpcSHMWith(ln net.Listener, cfg transport.Config) (Server, error) {
	sln, err := listenSHM(ln, cfg.SHM())
	if err != nil {
		return nil, err
	}
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("soft.OpenTCP: %w", err), sln.Close())
	}
	return &sameHostServer{Server: serveMwrpc(dev, sln, rpc.WithTransport(cfg)), tcp: ln}, nil
}

func dialMwrpcSHM(addr string, size, conc int) (Instance, error) {
	target, err := shmTarget(addr)
	if err != nil {
		return nil, err
	}
	return dialMwrpcTCP(target, size, conc)
}

// dialMwrpcSHMPoll is dialMwrpcSHM with busy polling (mwrpc-shm-poll).
func dialMwrpcSHMPoll(addr string, size, conc int) (Instance, error) {
	target, err := shmTarget(addr)
	if err != nil {
		return nil, err
	}
	return dialMwrpcPoll(target, size, conc)
}

// dialMwrpcSHMLanes is dialMwrpcLanes over shm (mwrpc-shm-lanes2, -lanes8).
func dialMwrpcSHMLanes(n int) func(addr string, size, conc int) (Instance, error) {
	return func(addr string, size, conc int) (Instance, error) {
		target, err := shmTarget(addr)
		if err != nil {
			return nil, err
		}
		return dialMwrpcLanes(n)(target, size, conc)
	}
}

// dialMwrpcSHMLent is dialMwrpcLent over shm (mwrpc-shm-lent).
func dialMwrpcSHMLent(addr string, size, conc int) (Instance, error) {
	target, err := shmTarget(addr)
	if err != nil {
		return nil, err
	}
	return dialMwrpcLent(target, size, conc)
}

// mwrpcSHMLentStreamDesc describes mwrpc-shm-lent in the streaming cell.
const mwrpcSHMLentStreamDesc = "mwrpc-shm's streams with mwrpc-lent's messages (built in registered memory, read where they landed): each message crosses in the one copy its placed READ makes"

func serveMwrpcSHMStream(ln net.Listener) (Server, error) { return serveMwrpcSHMBulk(ln, bulkImpl{}) }

func serveMwrpcSHMLentStream(ln net.Listener) (Server, error) {
	return serveMwrpcSHMBulk(ln, bulkImpl{lent: true})
}

func serveMwrpcSHMBulk(ln net.Listener, impl bulkImpl) (Server, error) {
	sln, err := listenSHM(ln, shm.Config{})
	if err != nil {
		return nil, err
	}
	srv, err := serveMwrpcBulk(sln, impl)
	if err != nil {
		return nil, errors.Join(err, sln.Close())
	}
	return &sameHostServer{Server: srv, tcp: ln}, nil
}

func dialMwrpcSHMStream(addr string) (StreamInstance, error) { return dialMwrpcSHMBulk(addr, false) }

func dialMwrpcSHMLentStream(addr string) (StreamInstance, error) {
	return dialMwrpcSHMBulk(addr, true)
}

func dialMwrpcSHMBulk(addr string, lent bool) (StreamInstance, error) {
	target, err := shmTarget(addr)
	if err != nil {
		return nil, err
	}
	return dialMwrpcBulk(target, lent)
}
