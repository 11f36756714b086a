package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/connpool"
	"github.com/cloudwego/kitex/pkg/klog"
	"github.com/cloudwego/kitex/pkg/serviceinfo"
	"github.com/cloudwego/kitex/server"
)

// Kitex (github.com/cloudwego/kitex) is ByteDance's RPC framework: its real server (on
// netpoll) and client (its long-connection pool) with Thrift over TTHeader-less framed
// binary, the way kitex's generator would set them up. The service is written by hand as
// the generator would write it for
//
//	service Bench { binary Echo(1: binary req) }
//
// with the FastCodec methods its generated structs have: no reflection, no frugal.

func init() {
	klog.SetOutput(io.Discard) // its startup and per-connection lines would fill the harness's stderr
}

// kitexEchoArgs is Bench.Echo's argument struct (field 1: binary req).
type kitexEchoArgs struct{ Req []byte }

// kitexEchoResult is Bench.Echo's result struct (field 0: binary success).
type kitexEchoResult struct{ Success []byte }

// kitexBinaryStruct is the FastCodec of a struct with one binary field id.
func kitexBLength(v []byte) int {
	return thrift.Binary.FieldBeginLength() + thrift.Binary.BinaryLengthNocopy(v) + thrift.Binary.FieldStopLength()
}

func kitexWrite(buf []byte, bw thrift.NocopyWriter, id int16, v []byte) int {
	off := thrift.Binary.WriteFieldBegin(buf, thrift.STRING, id)
	off += thrift.Binary.WriteBinaryNocopy(buf[off:], bw, v)
	return off + thrift.Binary.WriteFieldStop(buf[off:])
}

// kitexRead reads a struct whose field id is binary, skipping any other field.
func kitexRead(buf []byte, id int16) ([]byte, int, error) {
	var out []byte
	off := 0
	for {
		t, fid, l, err := thrift.Binary.ReadFieldBegin(buf[off:])
		if err != nil {
			return nil, off, err
		}
		off += l
		if t == thrift.STOP {
			return out, off, nil
		}
		if t == thrift.STRING && fid == id {
			v, l, err := thrift.Binary.ReadBinary(buf[off:])
			if err != nil {
				return nil, off, err
			}
			out, off = v, off+l
			continue
		}
		l, err = thrift.Binary.Skip(buf[off:], t)
		if err != nil {
			return nil, off, err
		}
		off += l
	}
}

func (a *kitexEchoArgs) BLength() int { return kitexBLength(a.Req) }
func (a *kitexEchoArgs) FastWriteNocopy(buf []byte, bw thrift.NocopyWriter) int {
	return kitexWrite(buf, bw, 1, a.Req)
}
func (a *kitexEchoArgs) FastRead(buf []byte) (n int, err error) {
	a.Req, n, err = kitexRead(buf, 1)
	return n, err
}
func (r *kitexEchoResult) BLength() int { return kitexBLength(r.Success) }
func (r *kitexEchoResult) FastWriteNocopy(buf []byte, bw thrift.NocopyWriter) int {
	return kitexWrite(buf, bw, 0, r.Success)
}
func (r *kitexEchoResult) FastRead(buf []byte) (n int, err error) {
	r.Success, n, err = kitexRead(buf, 0)
	return n, err
}

// kitexBench is the service's handler interface, as generated.
type kitexBench interface {
	Echo(ctx context.Context, req []byte) ([]byte, error)
}

type kitexEcho struct{}

// Echo returns its input.
func (kitexEcho) Echo(_ context.Context, req []byte) ([]byte, error) { return req, nil }

func kitexEchoHandler(ctx context.Context, handler, arg, result any) error {
	out, err := handler.(kitexBench).Echo(ctx, arg.(*kitexEchoArgs).Req)
	if err != nil {
		return err
	}
	result.(*kitexEchoResult).Success = out
	return nil
}

// kitexServiceInfo is what the generator writes in the service's package.
var kitexServiceInfo = &serviceinfo.ServiceInfo{
	ServiceName:  "Bench",
	HandlerType:  (*kitexBench)(nil),
	PayloadCodec: serviceinfo.Thrift,
	Methods: map[string]serviceinfo.MethodInfo{
		"Echo": serviceinfo.NewMethodInfo(kitexEchoHandler,
			func() any { return new(kitexEchoArgs) }, func() any { return new(kitexEchoResult) }, false),
	},
	Extra: map[string]any{},
}

// kitexServer is a Kitex server serving the echo on a listener.
type kitexServer struct {
	srv    server.Server
	exit   chan error // Run's exit signal: Close sends on it (Kitex's own would catch SIGTERM)
	served chan error
}

func serveKitex(ln net.Listener) (Server, error) {
	k := &kitexServer{exit: make(chan error, 1), served: make(chan error, 1)}
	srv := server.NewServer(server.WithListener(ln), server.WithExitWaitTime(time.Second),
		server.WithExitSignal(func() <-chan error { return k.exit }))
	// A pointer, as generated handlers are (Kitex checks it is not nil).
	if err := srv.RegisterService(kitexServiceInfo, &kitexEcho{}); err != nil {
		return nil, fmt.Errorf("kitex register: %w", err)
	}
	k.srv = srv
	go func() { k.served <- srv.Run() }()
	return k, nil
}

func (k *kitexServer) Copied() (uint64, bool) { return 0, false }

// Close makes Run return (it stops the server) and waits for it.
func (k *kitexServer) Close() error {
	k.exit <- nil
	select {
	case err := <-k.served:
		return err
	case <-time.After(5 * time.Second):
		return errors.New("kitex: Run did not return 5s after its exit signal")
	}
}

// kitexInstance is one Kitex client whose long-connection pool keeps a connection per
// caller (a Kitex connection carries one call at a time), as Kitex's pool does for
// concurrent callers.
type kitexInstance struct {
	c    client.Client
	req  []byte
	once sync.Once
}

func dialKitex(addr string, size, concurrency int) (Instance, error) {
	c, err := client.NewClient(kitexServiceInfo, client.WithDestService("Bench"), client.WithHostPorts(addr),
		client.WithLongConnection(connpool.IdleConfig{MaxIdlePerAddress: concurrency, MaxIdleGlobal: concurrency, MaxIdleTimeout: time.Minute}),
		client.WithRPCTimeout(30*time.Second), client.WithConnectTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("kitex client: %w", err)
	}
	return &kitexInstance{c: c, req: payload(size)}, nil
}

func (k *kitexInstance) Call(w int) error {
	args := kitexEchoArgs{Req: k.req}
	var res kitexEchoResult
	if err := k.c.Call(context.Background(), "Echo", &args, &res); err != nil {
		return err
	}
	return checkLen("kitex", len(res.Success), len(k.req))
}

func (k *kitexInstance) Copied() (uint64, bool) { return 0, false }

// Close closes the client's connection pool.
func (k *kitexInstance) Close() error {
	var err error
	k.once.Do(func() {
		if c, ok := k.c.(io.Closer); ok {
			err = c.Close()
		}
	})
	return err
}
