package rpc_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/internal/benchsvc"
)

// BenchmarkStubs calls through generated stubs over the soft TCP fabric: a small struct
// (msgpack) and []byte payloads of 64 B and 1 MiB (the raw codec), at concurrency 1 and 32.
// Client and server run in one process, so allocs/op counts both sides.
//
//	go test -run '^$' -bench Stubs -benchmem -count 5 ./rpc/
func BenchmarkStubs(b *testing.B) {
	srv := rpc.NewServer()
	benchsvc.RegisterBench(srv, benchsvc.Echo{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	client, err := rpc.Dial(context.Background(), ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	svc := benchsvc.NewBenchClient(client)
	small := &benchsvc.Small{Key: "user:1234", Value: bytes.Repeat([]byte{7}, 64), Version: 42}
	cases := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"struct", func(ctx context.Context) error { _, err := svc.Small(ctx, small); return err }},
	}
	for _, n := range []int{64, 1 << 20} {
		payload := bytes.Repeat([]byte{1}, n)
		cases = append(cases, struct {
			name string
			call func(ctx context.Context) error
		}{fmt.Sprintf("bytes%d", n), func(ctx context.Context) error {
			out, err := svc.Bytes(ctx, payload)
			if err == nil && len(out) != n {
				err = fmt.Errorf("%d bytes back", len(out))
			}
			return err
		}})
	}
	for _, tc := range cases {
		for _, conc := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/c%d", tc.name, conc), func(b *testing.B) {
				ctx := context.Background()
				for i := 0; i < 20; i++ {
					if err := tc.call(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				if conc == 1 {
					for i := 0; i < b.N; i++ {
						if err := tc.call(ctx); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(conc / 2)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := tc.call(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
