package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/mwrpc/mwrpc/mwnet"
)

// BenchmarkUnary makes gRPC-Go unary calls (the interop TestService's UnaryCall, payload
// each way) over loopback TCP and over mwnet on each fabric, and reports each call's
// structure beside its time: Writes and Reads gRPC made on its net.Conn on each side, and
// over mwnet the listener's SENDs and stream acks sent as messages of their own. The
// counts are structural; the times are indicative on a loaded machine.
func BenchmarkUnary(b *testing.B) {
	fabrics := []struct{ name, target string }{{"tcp", ""}, {"mwnet", "127.0.0.1:0"}}
	if runtime.GOOS == "linux" {
		fabrics = append(fabrics, struct{ name, target string }{"mwnet-shm", "shm://" + filepath.Join(b.TempDir(), "bench.sock")})
	}
	for _, cell := range []struct{ size, callers int }{{64, 1}, {64, 16}, {1 << 20, 1}} {
		for _, f := range fabrics {
			b.Run(fmt.Sprintf("%s/%dB/c%d", f.name, cell.size, cell.callers), func(b *testing.B) {
				benchUnary(b, f.target, cell.size, cell.callers)
			})
		}
	}
}

// benchUnary makes the calls from callers goroutines at once (on one grpc.ClientConn).
func benchUnary(b *testing.B, target string, size, callers int) {
	var srvIO, cliIO ioCounts
	ln, stats := benchListener(b, target)
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, interop.NewTestServer())
	go func() { _ = s.Serve(countingListener{ln, &srvIO}) }()
	b.Cleanup(s.Stop)
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		var err error
		if target == "" {
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		} else {
			c, err = mwnet.Dial(ctx, addr)
		}
		if err != nil {
			return nil, err
		}
		return countingConn{c, &cliIO}, nil
	}
	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	tc := testgrpc.NewTestServiceClient(cc)
	req := &testgrpc.SimpleRequest{ResponseSize: int32(size), Payload: &testgrpc.Payload{Body: make([]byte, size)}}
	call := func() {
		if _, err := tc.UnaryCall(context.Background(), req, grpc.MaxCallRecvMsgSize(4<<20)); err != nil {
			b.Fatal(err)
		}
	}
	call() // the connection is up, and its windows settled, before counting
	call()
	srv0, cli0, st0 := srvIO.load(), cliIO.load(), stats()
	b.SetBytes(int64(2 * size))
	b.ReportAllocs()
	if callers == 1 {
		for b.Loop() {
			call()
		}
	} else {
		b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				call()
			}
		})
	}
	n := float64(b.N)
	srv, cli, st := srvIO.load(), cliIO.load(), stats()
	b.ReportMetric(float64(cli[0]-cli0[0])/n, "cliWrites/op")
	b.ReportMetric(float64(cli[1]-cli0[1])/n, "cliReads/op")
	b.ReportMetric(float64(srv[0]-srv0[0])/n, "srvWrites/op")
	b.ReportMetric(float64(srv[1]-srv0[1])/n, "srvReads/op")
	if target != "" {
		b.ReportMetric(float64(st.Sends-st0.Sends)/n, "srvSENDs/op")
		b.ReportMetric(float64(st.StreamAcks-st0.StreamAcks)/n, "srvAcks/op")
		b.ReportMetric(float64(st.WindowsBound-st0.WindowsBound)/n, "srvWindows/op")
		b.ReportMetric(float64(st.Reads-st0.Reads)/n, "srvREADs/op")
	}
}

// benchListener listens on target (loopback TCP where target is empty) and returns a
// function reading the mwnet listener's stats (zero for TCP).
func benchListener(b *testing.B, target string) (net.Listener, func() (s benchStats)) {
	if target == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		return ln, func() (s benchStats) { return s }
	}
	ln, err := mwnet.Listen(target)
	if err != nil {
		b.Fatal(err)
	}
	return ln, func() (s benchStats) {
		st := ln.Stats()
		return benchStats{st.Sends, st.StreamAcks, st.WindowsBound, st.Reads}
	}
}

// benchStats are the mwnet listener's counts BenchmarkUnary reports.
type benchStats struct{ Sends, StreamAcks, WindowsBound, Reads uint64 }

// ioCounts counts the Writes and Reads made on one side's net.Conns.
type ioCounts struct{ writes, reads atomic.Uint64 }

func (c *ioCounts) load() [2]uint64 { return [2]uint64{c.writes.Load(), c.reads.Load()} }

type countingConn struct {
	net.Conn
	n *ioCounts
}

func (c countingConn) Write(p []byte) (int, error) { c.n.writes.Add(1); return c.Conn.Write(p) }
func (c countingConn) Read(p []byte) (int, error)  { c.n.reads.Add(1); return c.Conn.Read(p) }

type countingListener struct {
	net.Listener
	n *ioCounts
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.n}, nil
}
