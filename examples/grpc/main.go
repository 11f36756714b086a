// Command grpc serves gRPC-Go's interop TestService over mwnet, and calls it: gRPC-Go
// runs unchanged on mwrpc's fabrics, with a net.Listener from mwnet.Listen on the server
// and grpc.WithContextDialer(mwnet.Dialer()) on the client.
//
//	grpc -listen 127.0.0.1:7070                  # soft TCP fabric
//	grpc -listen shm:///tmp/grpc.sock            # shared memory, same host (Linux)
//	grpc -dial shm:///tmp/grpc.sock              # empty_unary and large_unary against it
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/mwrpc/mwrpc/mwnet"
)

func main() {
	listen := flag.String("listen", "", "serve the interop TestService at this mwnet target")
	dial := flag.String("dial", "", "call the TestService at this mwnet target")
	flag.Parse()
	var err error
	switch {
	case *listen != "":
		err = serve(*listen)
	case *dial != "":
		err = call(*dial)
	default:
		err = fmt.Errorf("give -listen or -dial a target: host:port or shm:///path/to.sock")
	}
	if err != nil {
		log.Fatal(err)
	}
}

// Serve serves gRPC's interop TestService at target (opts: mwnet.WithDevice for an RDMA
// device, for example); stop stops it (and closes the listener) and waits for its Serve
// to return.
func Serve(target string, opts ...mwnet.Option) (addr string, stop func(), err error) {
	ln, err := mwnet.Listen(target, opts...)
	if err != nil {
		return "", nil, err
	}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, interop.NewTestServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	return ln.Addr().String(), func() { s.Stop(); <-done }, nil
}

// NewClient returns a gRPC client connection to an mwnet target; opts go to each Dial.
func NewClient(target string, opts ...mwnet.Option) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+target,
		grpc.WithContextDialer(mwnet.Dialer(opts...)),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("mwnet"))
}

func serve(target string) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	addr, stop, err := Serve(target)
	if err != nil {
		return err
	}
	log.Printf("gRPC interop TestService over mwnet at %s", addr)
	<-ctx.Done()
	stop()
	return nil
}

func call(target string) error {
	cc, err := NewClient(target)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tc := testgrpc.NewTestServiceClient(cc)
	interop.DoEmptyUnaryCall(ctx, tc) // these exit the process on a failure
	interop.DoLargeUnaryCall(ctx, tc)
	fmt.Println("empty_unary and large_unary passed over", target)
	return nil
}
