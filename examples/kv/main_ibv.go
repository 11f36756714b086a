//go:build ibverbs && linux && cgo

package main

import (
	"flag"
	"log"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

// With the build tag ibverbs, -device puts the server and the client on an RDMA device
// through the ibv provider (each side opens it for itself):
//
//	go run -tags ibverbs ./examples/kv -device rxe0
var device = flag.String("device", "", "RDMA device for the server and the client (ibv provider), for example rxe0; empty: the soft TCP fabric")

func init() {
	deviceName = func() string { return *device }
	serverDevice = func() (rpc.ServerOption, func(), error) {
		d, err := openDevice()
		if err != nil {
			return nil, nil, err
		}
		return rpc.WithDevice(d), closer(d), nil
	}
	clientDevice = func() (rpc.DialOption, func(), error) {
		d, err := openDevice()
		if err != nil {
			return nil, nil, err
		}
		return rpc.WithDevice(d), closer(d), nil
	}
}

func openDevice() (*ibv.Device, error) { return ibv.Open(*device) }

func closer(d *ibv.Device) func() {
	return func() {
		if err := d.Close(); err != nil {
			log.Printf("close %s: %v", d.Name(), err)
		}
	}
}
