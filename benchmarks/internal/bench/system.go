// Package bench is the side-by-side harness behind cmd/mwrpcbench: the systems under test
// (mwrpc over both soft fabrics, gRPC-Go, net/rpc and a raw TCP ping-pong), the runner that
// interleaves and repeats them, and the reports (JSON, markdown, PNG charts).
//
// Every system runs its client and its server in this one process, over loopback or the
// in-process fabric, so allocation and CPU figures are those of both sides together.
package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Instance is one system set up for one cell: a server and its client(s), with one worker
// slot per concurrent caller.
type Instance interface {
	// Call makes one echo round trip of the cell's payload from worker w (0 <= w <
	// concurrency). Different workers call concurrently; one worker never does.
	Call(w int) error
	// Copied returns the bytes the provider has counted as moved or copied so far, and
	// whether it counts them at all.
	Copied() (uint64, bool)
	// Close tears the server and client down.
	Close() error
}

// System is one RPC system under test.
type System struct {
	Name string // as in -systems and in the results
	Desc string // one line for the reports
	// Open starts a server and connects a client for payloads of size bytes and
	// concurrency callers.
	Open func(size, concurrency int) (Instance, error)
}

// Systems lists every system, in the order the reports show them.
var Systems = []System{
	{Name: "mwrpc-tcp", Desc: "mwrpc, soft provider over the TCP fabric (loopback), generated stub, raw codec", Open: openMwrpcTCP},
	{Name: "mwrpc-inproc", Desc: "mwrpc, soft provider over the in-process fabric (one soft.NewFabric)", Open: openMwrpcInproc},
	{Name: "grpc", Desc: "gRPC-Go over loopback TCP, hand-written ServiceDesc, raw-bytes codec (no protobuf)", Open: openGRPC},
	{Name: "netrpc", Desc: "net/rpc (gob) over loopback TCP, one client shared by all callers", Open: openNetRPC},
	{Name: "rawtcp", Desc: "length-prefixed echo over loopback TCP, one connection per caller: the floor", Open: openRawTCP},
}

// SystemNames returns the names of Systems.
func SystemNames() []string {
	names := make([]string, len(Systems))
	for i, s := range Systems {
		names[i] = s.Name
	}
	return names
}

// LookupSystems returns the systems named in a comma-separated list, in Systems order;
// "all" or "" means every system.
func LookupSystems(list string) ([]System, error) {
	if list == "" || list == "all" {
		return slices.Clone(Systems), nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(SystemNames(), n) {
			if n == "mwrpc-ibv" {
				return nil, fmt.Errorf("system mwrpc-ibv (the cgo ibv provider) is not part of the harness yet")
			}
			return nil, fmt.Errorf("unknown system %q (have %s)", n, strings.Join(SystemNames(), ", "))
		}
		want[n] = true
	}
	var out []System
	for _, s := range Systems {
		if want[s.Name] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no system named in %q", list)
	}
	return out, nil
}

// payload returns n bytes of a fixed pattern.
func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// checkLen is the check every Call makes on its response: an echo returns as many bytes
// as it was sent. (Comparing contents would add a memcmp per call to every system.)
func checkLen(system string, got, want int) error {
	if got != want {
		return fmt.Errorf("%s: response of %d bytes to a request of %d", system, got, want)
	}
	return nil
}
