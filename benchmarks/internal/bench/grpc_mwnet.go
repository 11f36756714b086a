package bench

import (
	"net"

	"google.golang.org/grpc"

	"github.com/mwrpc/mwrpc/mwnet"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// gRPC-Go over mwnet: the grpc system's server and client, unchanged, with mwnet's
// listener and dialer under them (one mwnet Conn, one queue pair, per grpc.ClientConn).

const grpcMwnetDesc = "gRPC-Go (the grpc system) over mwnet: its HTTP/2 connection is one mwnet stream on a soft-provider queue pair over the TCP fabric (loopback)"

const grpcMwnetSHMDesc = "gRPC-Go (the grpc system) over mwnet on the shm fabric (same host only): one mwnet stream on a queue pair over shared-memory rings"

func serveGRPCMwnet(ln net.Listener) (Server, error) {
	ml, err := mwnet.NewListener(ln)
	if err != nil {
		return nil, err
	}
	return serveGRPCWith(ml, grpc.WriteBufferSize(mwnetGRPCBuffer), grpc.ReadBufferSize(mwnetGRPCBuffer))
}

// mwnetGRPCBuffer is gRPC's write (and read) buffer over mwnet: each flush of gRPC's
// buffer is one mwnet Write, and a message above the transport's eager threshold costs a
// window bind, a READ and a revocation, so fewer, larger writes pay off.
const mwnetGRPCBuffer = 256 << 10

func dialGRPCMwnet(addr string, size, concurrency int) (Instance, error) {
	return dialGRPCOver(addr, size, concurrency)
}

func serveGRPCMwnetSHM(ln net.Listener) (Server, error) {
	path, err := sameHostSocket("grpc-mwnet-shm", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	sl, err := shm.Listen(path, shm.Config{})
	if err != nil {
		return nil, err
	}
	srv, err := serveGRPCMwnet(sl)
	if err != nil {
		return nil, err
	}
	return &sameHostServer{Server: srv, tcp: ln}, nil
}

func dialGRPCMwnetSHM(addr string, size, concurrency int) (Instance, error) {
	path, err := sameHostSocket("grpc-mwnet-shm", addr)
	if err != nil {
		return nil, err
	}
	return dialGRPCOver(shm.Scheme+path, size, concurrency)
}

// dialGRPCOver is dialGRPC with mwnet's dialer to target.
func dialGRPCOver(target string, size, concurrency int) (Instance, error) {
	return dialGRPCWith("passthrough:///"+target, size, concurrency,
		grpc.WithContextDialer(mwnet.Dialer()),
		grpc.WithAuthority("mwnet"),
		grpc.WithWriteBufferSize(mwnetGRPCBuffer), grpc.WithReadBufferSize(mwnetGRPCBuffer))
}
