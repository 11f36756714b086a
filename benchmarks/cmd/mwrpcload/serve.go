package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/load"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// openDevice, when the ibverbs build sets it, opens the named RDMA device; nil means the
// soft TCP fabric only.
var openDevice func(name string) (verbs.Device, error)

// withDevice opens -device (if set) and returns it and what closes it.
func withDevice(name string) (verbs.Device, func(), error) {
	if name == "" {
		return nil, func() {}, nil
	}
	if openDevice == nil {
		return nil, nil, fmt.Errorf("-device %s: this build has no ibv provider (build with -tags ibverbs)", name)
	}
	d, err := openDevice(name)
	if err != nil {
		return nil, nil, err
	}
	return d, func() { _ = d.Close() }, nil
}

// dialOptions puts a client on d, if set.
func dialOptions(d verbs.Device, opts ...rpc.DialOption) []rpc.DialOption {
	if d != nil {
		opts = append(opts, rpc.WithDevice(d))
	}
	return opts
}

// serve serves Load until SIGINT or SIGTERM, then stops gracefully. It prints
// "listening ADDR" on stdout once it accepts.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on: host:port, or shm:///path/to.sock for the same host's shm fabric")
	dev := fs.String("device", "", "RDMA device (ibv provider); empty: the soft TCP fabric")
	_ = fs.Parse(args)
	d, done, err := withDevice(*dev)
	if err != nil {
		return err
	}
	defer done()
	// The load's callers ping every second without a response (-keepalive-timeout): the
	// fault runs rely on it to drop wedged connections, so the server permits it.
	sopts := []rpc.ServerOption{rpc.WithKeepalivePolicy(transport.ServerKeepalive{MinPingInterval: 500 * time.Millisecond, PermitWithoutCalls: true})}
	if d != nil {
		sopts = append(sopts, rpc.WithDevice(d))
	}
	srv := rpc.NewServer(sopts...)
	load.RegisterLoad(srv, load.Server{Srv: srv})
	ln, err := srv.Listen(*listen)
	if err != nil {
		return err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	go func() { <-stop; srv.GracefulStop() }()
	fmt.Printf("listening %s\n", ln.Addr())
	return srv.Serve(ln)
}

// stats prints the server's Stats as JSON.
func stats(args []string) error {
	fs := flag.NewFlagSet("stats", flag.ExitOnError)
	target := fs.String("target", "127.0.0.1:7000", "server address: host:port, or shm:///path/to.sock")
	dev := fs.String("device", "", "RDMA device (ibv provider); empty: the soft TCP fabric")
	_ = fs.Parse(args)
	d, done, err := withDevice(*dev)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := serverStats(ctx, *target, dialOptions(d))
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(st)
}

// serverStats dials target, asks for Stats and closes.
func serverStats(ctx context.Context, target string, opts []rpc.DialOption) (*load.Stats, error) {
	c, err := rpc.Dial(ctx, target, opts...)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return load.NewLoadClient(c).Stats(ctx, &load.StatsRequest{})
}
