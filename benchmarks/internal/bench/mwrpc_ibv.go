//go:build ibverbs && linux && cgo

package bench

import (
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

// IBVDeviceEnv names the environment variable that picks mwrpc-ibv's RDMA device (as in
// the rpc package's TestIBV); empty or unset: the first device. Server processes inherit
// it from the harness.
const IBVDeviceEnv = "MWRPC_IBV_DEVICE"

// The ibverbs build adds mwrpc-ibv, after mwrpc-tcp: mwrpc over the cgo ibv provider, the
// server and the client each on a context of their own of one RDMA device. Connections are
// set up as rpc does on any device: the client dials the server's TCP listener (loopback
// here) and the two exchange their queue pairs' addresses over it; every call after that
// goes over the device. It is not in "all": it needs an RDMA device (make bench-rxe runs it
// on Soft-RoCE in a VM).
func init() {
	i := slices.IndexFunc(Systems, func(s System) bool { return s.Name == "mwrpc-tcp" }) + 1
	Systems = slices.Insert(Systems, i, System{
		Name:      ibvSystem,
		Desc:      "mwrpc, the cgo ibv provider on an RDMA device (" + IBVDeviceEnv + ", default the first; connections set up over loopback TCP), generated stub, raw codec",
		Serve:     serveMwrpcIBV,
		Dial:      dialMwrpcIBV,
		NamedOnly: true,
		Note:      ibvNote,
	})
}

// openIBV opens the device IBVDeviceEnv names.
func openIBV() (*ibv.Device, error) {
	name := os.Getenv(IBVDeviceEnv)
	d, err := ibv.Open(name)
	if err != nil {
		return nil, fmt.Errorf("ibv.Open(%q) (%s): %w", name, IBVDeviceEnv, err)
	}
	return d, nil
}

// ibvNote opens the device once, to name it in the report (and to fail early without one).
func ibvNote() (string, error) {
	d, err := openIBV()
	if err != nil {
		return "", err
	}
	note := fmt.Sprintf("%s runs on the RDMA device %s (GID index %d)", ibvSystem, d.Name(), d.GIDIndex())
	if d.SoftRoCE() {
		note += ": Soft-RoCE (rdma_rxe), a software RDMA NIC in the kernel, whose figures are not a hardware NIC's"
	}
	if err := d.Close(); err != nil {
		return "", fmt.Errorf("close %s: %w", d.Name(), err)
	}
	return note + ".", nil
}

// serveMwrpcIBV serves echo.Bench on the RDMA device, with rpc's defaults otherwise.
func serveMwrpcIBV(ln net.Listener) (Server, error) {
	d, err := openIBV()
	if err != nil {
		return nil, err
	}
	return serveMwrpc(d, ln), nil
}

// dialMwrpcIBV connects a client on a context of its own of the RDMA device.
func dialMwrpcIBV(addr string, size, _ int) (Instance, error) {
	d, err := openIBV()
	if err != nil {
		return nil, err
	}
	return dialMwrpc(d, addr, size)
}
