package bench

import (
	"context"
	"errors"
	"fmt"
	"net"

	"storj.io/drpc"
	"storj.io/drpc/drpcconn"
	"storj.io/drpc/drpcmanager"
	"storj.io/drpc/drpcmux"
	"storj.io/drpc/drpcserver"
	"storj.io/drpc/drpcwire"
)

// drpcManager lifts DRPC's 4 MiB default limit on a message (drpcwire.ReaderOptions) above
// the harness's largest payload, 16 MiB, on both sides, as grpcMaxMessage does for gRPC.
var drpcManager = drpcmanager.Options{Reader: drpcwire.ReaderOptions{MaximumBufferSize: 64 << 20}}

// drpcRawEncoding is a DRPC encoding for *[]byte messages: no protobuf, the same payload
// bytes as mwrpc's raw codec.
type drpcRawEncoding struct{}

// Marshal returns the bytes themselves: DRPC appends them to its write buffer.
func (drpcRawEncoding) Marshal(msg drpc.Message) ([]byte, error) {
	p, ok := msg.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("drpc raw encoding: cannot marshal %T", msg)
	}
	return *p, nil
}

// Unmarshal copies buf into the message's own capacity: DRPC reuses buf once Unmarshal
// returns (drpcstream's packet buffer).
func (drpcRawEncoding) Unmarshal(buf []byte, msg drpc.Message) error {
	p, ok := msg.(*[]byte)
	if !ok {
		return fmt.Errorf("drpc raw encoding: cannot unmarshal into %T", msg)
	}
	*p = append((*p)[:0], buf...)
	return nil
}

// drpcEchoRPC is the RPC's name on the wire, as protoc-gen-go-drpc would write it.
const drpcEchoRPC = "/bench.Bench/Echo"

// drpcEcho is the DRPC service: the same echo.
type drpcEcho struct{}

// Echo returns its input.
func (drpcEcho) Echo(_ context.Context, in *[]byte) (*[]byte, error) { return in, nil }

// drpcEchoDesc is what protoc-gen-go-drpc would write for service Bench, by hand.
type drpcEchoDesc struct{}

// NumMethods returns 1: Echo.
func (drpcEchoDesc) NumMethods() int { return 1 }

// Method describes Echo.
func (drpcEchoDesc) Method(n int) (string, drpc.Encoding, drpc.Receiver, any, bool) {
	if n != 0 {
		return "", nil, nil, nil, false
	}
	recv := func(srv any, ctx context.Context, in1, _ any) (drpc.Message, error) {
		return srv.(drpcEcho).Echo(ctx, in1.(*[]byte))
	}
	return drpcEchoRPC, drpcRawEncoding{}, recv, drpcEcho.Echo, true
}

// drpcServer is a drpcserver.Server serving the echo.
type drpcServer struct {
	cancel context.CancelFunc
	served chan error
}

func serveDRPC(ln net.Listener) (Server, error) {
	mux := drpcmux.New()
	if err := mux.Register(drpcEcho{}, drpcEchoDesc{}); err != nil {
		return nil, fmt.Errorf("drpc register: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &drpcServer{cancel: cancel, served: make(chan error, 1)}
	go func() {
		d.served <- drpcserver.NewWithOptions(mux, drpcserver.Options{Manager: drpcManager}).Serve(ctx, ln)
	}()
	return d, nil
}

func (d *drpcServer) Copied() (uint64, bool) { return 0, false }

// Close cancels Serve's context, which closes the listener and the connections, and waits
// for Serve to return.
func (d *drpcServer) Close() error {
	d.cancel()
	if err := <-d.served; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// drpcInstance is one drpcconn.Conn per worker: a DRPC connection carries one call at a
// time, so callers sharing one would take turns.
type drpcInstance struct {
	conns []*drpcconn.Conn
	req   []byte
	out   [][]byte // per worker
}

func dialDRPC(addr string, size, concurrency int) (Instance, error) {
	d := &drpcInstance{req: payload(size), out: make([][]byte, concurrency)}
	for range concurrency {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("dial: %w", err), d.Close())
		}
		d.conns = append(d.conns, drpcconn.NewWithOptions(c, drpcconn.Options{Manager: drpcManager}))
	}
	return d, nil
}

func (d *drpcInstance) Call(w int) error {
	if err := d.conns[w].Invoke(context.Background(), drpcEchoRPC, drpcRawEncoding{}, &d.req, &d.out[w]); err != nil {
		return err
	}
	return checkLen("drpc", len(d.out[w]), len(d.req))
}

func (d *drpcInstance) Copied() (uint64, bool) { return 0, false }

func (d *drpcInstance) Close() error {
	var err error
	for _, c := range d.conns {
		err = errors.Join(err, c.Close())
	}
	return err
}
