// Package bench is the side-by-side harness behind cmd/mwrpcbench: the systems under test
// (mwrpc over both soft fabrics, gRPC-Go, DRPC, net/rpc and a raw TCP ping-pong), the runner that
// interleaves and repeats them, and the reports (JSON, markdown, PNG charts).
//
// The runner has two modes (Mode). In the default, ModeTwoProcess, each system's server
// runs in a process of its own (the harness binary started again with -serve-system; see
// ServeMain and serverProc), so allocation and CPU figures are the client's alone. In
// ModeInProcess client and server share this process, over loopback or the in-process
// fabric, and those figures are both sides together.
package bench

import (
	"errors"
	"fmt"
	"net"
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

// Server is the server side of a system, serving on a listener (in this process or in a
// server process of its own).
type Server interface {
	// Copied is Instance.Copied for the server's side.
	Copied() (uint64, bool)
	// Close stops the server and closes its listener.
	Close() error
}

// System is one RPC system under test.
type System struct {
	Name string // as in -systems and in the results
	Desc string // one line for the reports
	// Serve starts the system's server on ln, for payloads of any size the matrix has.
	// Nil for a system that exists only in one process (mwrpc-inproc): see Open.
	Serve func(ln net.Listener) (Server, error)
	// Dial connects a client to the server at addr for payloads of size bytes and
	// concurrency callers. The Instance's Close closes the client only.
	Dial func(addr string, size, concurrency int) (Instance, error)
	// Open, if not nil, sets up server and client together in this process; for systems
	// without Serve and Dial.
	Open func(size, concurrency int) (Instance, error)
	// NamedOnly keeps the system out of "all": it runs only when -systems names it
	// (mwrpc-ibv, which needs an RDMA device).
	NamedOnly bool
	// Note, if not nil, returns a line for the report's notes when the system runs (where
	// it runs: mwrpc-ibv's device), or an error when it cannot run on this machine.
	Note func() (string, error)

	// The streaming cell (stream.go). Nil for a system that is not in it; a system with
	// these alone (mwrpc-stream16M) is in the streaming cell only.

	// StreamDesc is Desc for the streaming cell: how the system streams.
	StreamDesc string
	// ServeStream starts the system's bulk server on ln: it answers a server-stream
	// request with the bytes asked for, and reads a client stream to its end, then
	// answers once.
	ServeStream func(ln net.Listener) (Server, error)
	// DialStream connects a streaming client to the bulk server at addr.
	DialStream func(addr string) (StreamInstance, error)
}

// TwoProcess reports whether the system can run its echo server in a process of its own.
func (s System) TwoProcess() bool { return s.Serve != nil && s.Dial != nil }

// Echo reports whether the system is in the echo matrix (in some mode).
func (s System) Echo() bool { return s.TwoProcess() || s.Open != nil }

// Streams reports whether the system is in the streaming cell.
func (s System) Streams() bool { return s.ServeStream != nil && s.DialStream != nil }

// ibvSystem is the name of mwrpc over the cgo ibv provider, a system only in the ibverbs
// build (mwrpc_ibv.go).
const ibvSystem = "mwrpc-ibv"

// Systems lists every system, in the order the reports show them. The ibverbs build adds
// mwrpc-ibv after mwrpc-tcp (mwrpc_ibv.go).
var Systems = []System{
	{Name: "mwrpc-tcp", Desc: "mwrpc, soft provider over the TCP fabric (loopback), generated stub, raw codec", Serve: serveMwrpcTCP, Dial: dialMwrpcTCP,
		StreamDesc: mwrpcStreamDesc, ServeStream: serveMwrpcStream, DialStream: dialMwrpcStream},
	{Name: "mwrpc-stream16M", StreamDesc: mwrpcStream16MDesc, ServeStream: serveMwrpcStream16M, DialStream: dialMwrpcStream16M},
	{Name: "mwrpc-lent", Desc: "mwrpc-tcp with each request built in the client's registered memory (rpc.Client.Buffer) and each response lent rather than copied (rpc.WithLentResponses): no allocation on the client, and no copy but a request's of under 1 KiB into the send slot", Serve: serveMwrpcTCP, Dial: dialMwrpcLent,
		StreamDesc: mwrpcLentStreamDesc, ServeStream: serveMwrpcLentStream, DialStream: dialMwrpcLentStream},
	{Name: "mwrpc-lent-read", Desc: "mwrpc-lent against a server that grants no memory for written requests (transport.Config.GrantBytes -1): every large request is READ from the caller's window, one round trip more; named only, to measure what written requests change", Serve: serveMwrpcNoGrants, Dial: dialMwrpcLent, NamedOnly: true},
	{Name: "mwrpc-lanes1", Desc: "mwrpc-tcp with the client's lanes pinned to 1 (rpc.WithLanes(1): one connection) instead of adaptive; named only, to measure the lane policy", Serve: serveMwrpcTCP, Dial: dialMwrpcLanes(1), NamedOnly: true},
	{Name: "mwrpc-lanes2", Desc: "mwrpc-tcp with the client's lanes pinned to 2 (rpc.WithLanes(2)) instead of adaptive (2 calls in flight a lane, up to GOMAXPROCS lanes); named only, to measure the lane policy", Serve: serveMwrpcTCP, Dial: dialMwrpcLanes(2), NamedOnly: true},
	{Name: "mwrpc-lanes4", Desc: "mwrpc-tcp with the client's lanes pinned to 4 (rpc.WithLanes(4)); named only, to measure the lane policy", Serve: serveMwrpcTCP, Dial: dialMwrpcLanes(4), NamedOnly: true},
	{Name: "mwrpc-lanes8", Desc: "mwrpc-tcp with the client's lanes pinned to 8 (rpc.WithLanes(8)); named only, to measure the lane policy", Serve: serveMwrpcTCP, Dial: dialMwrpcLanes(8), NamedOnly: true},
	{Name: "mwrpc-lanes16", Desc: "mwrpc-tcp with the client's lanes pinned to 16 (rpc.WithLanes(16): a connection per caller at 16 callers, as DRPC, Kitex and raw TCP have); named only, to measure the lane policy", Serve: serveMwrpcTCP, Dial: dialMwrpcLanes(16), NamedOnly: true},
	{Name: "mwrpc-pollers", Desc: "mwrpc-tcp with a server poller per four of its cores (transport.Config.Pollers GOMAXPROCS/4: each its own completion queue and shared receive queue)", Serve: serveMwrpcPollers, Dial: dialMwrpcTCP},
	{Name: "mwrpc-poll", Desc: "mwrpc-tcp with busy polling on both sides (transport.Config.BusyPoll 50µs: callers and stream readers poll while their process is quiet, on 4 Ps or more); named only, to measure it", Serve: serveMwrpcPoll, Dial: dialMwrpcPoll, NamedOnly: true},
	{Name: "mwrpc-shm-poll", Desc: "mwrpc-shm with busy polling on both sides (transport.Config.BusyPoll 50µs, and the rings' readers' shm.Config.QuietSpin); named only, to measure it", Serve: serveMwrpcSHMPoll, Dial: dialMwrpcSHMPoll, NamedOnly: true},
	{Name: "mwrpc-pool", Desc: "mwrpc-tcp with every handler handed to the handler pool (transport.Config.InlineBudget -1: no adaptive inline)", Serve: serveMwrpcPool, Dial: dialMwrpcTCP},
	{Name: "mwrpc-inline", Desc: "mwrpc-tcp with the server's handlers run to completion where requests are reaped (transport.Config.InlineHandlers)", Serve: serveMwrpcInline, Dial: dialMwrpcTCP},
	{Name: "mwrpc-tuned", Desc: "mwrpc-tcp tuned for the soft TCP fabric: payloads up to 64 KiB inside the SEND (66 KiB slots, shared by the server's connections: SharedReceives 512), handlers run to completion", Serve: serveMwrpcTuned, Dial: dialMwrpcTuned},
	{Name: "mwrpc-tls", Desc: "mwrpc-tcp with the fabric's stream inside TLS 1.3 (transport credentials; self-signed certificate, the handshake not measured)", Serve: serveMwrpcTLS, Dial: dialMwrpcTLS},
	{Name: "mwrpc-shm", Desc: mwrpcSHMDesc, Serve: serveMwrpcSHM, Dial: dialMwrpcSHM,
		StreamDesc: mwrpcSHMStreamDesc, ServeStream: serveMwrpcSHMStream, DialStream: dialMwrpcSHMStream},
	{Name: "mwrpc-shm-lanes2", Desc: "mwrpc-shm with the client's lanes pinned to 2 (rpc.WithLanes(2)); named only, to measure the lane policy over shared memory", Serve: serveMwrpcSHM, Dial: dialMwrpcSHMLanes(2), NamedOnly: true},
	{Name: "mwrpc-shm-lanes4", Desc: "mwrpc-shm with the client's lanes pinned to 4 (rpc.WithLanes(4)); named only, to measure the lane policy over shared memory", Serve: serveMwrpcSHM, Dial: dialMwrpcSHMLanes(4), NamedOnly: true},
	{Name: "mwrpc-shm-lanes8", Desc: "mwrpc-shm with the client's lanes pinned to 8 (rpc.WithLanes(8): what the adaptive policy for sockets opens at 16 or more callers with 8 Ps); named only, to measure the lane policy over shared memory", Serve: serveMwrpcSHM, Dial: dialMwrpcSHMLanes(8), NamedOnly: true},
	{Name: "mwrpc-shm-lent", Desc: "mwrpc-shm with mwrpc-lent's client: requests built in registered memory, responses lent (over shm the server's READ of the request and its written response then cross in one copy each, made by the client)", Serve: serveMwrpcSHM, Dial: dialMwrpcSHMLent,
		StreamDesc: mwrpcSHMLentStreamDesc, ServeStream: serveMwrpcSHMLentStream, DialStream: dialMwrpcSHMLentStream},
	{Name: "mwrpc-inproc", Desc: "mwrpc, soft provider over the in-process fabric (one soft.NewFabric; in-process mode only)", Open: openMwrpcInproc},
	{Name: "grpc", Desc: "gRPC-Go over loopback TCP, hand-written ServiceDesc, raw-bytes codec (no protobuf)", Serve: serveGRPC, Dial: dialGRPC,
		StreamDesc: grpcStreamDesc, ServeStream: serveGRPCStream, DialStream: dialGRPCStream},
	{Name: "grpc-mwnet", Desc: grpcMwnetDesc, Serve: serveGRPCMwnet, Dial: dialGRPCMwnet},
	{Name: "grpc-mwnet-shm", Desc: grpcMwnetSHMDesc, Serve: serveGRPCMwnetSHM, Dial: dialGRPCMwnetSHM},
	{Name: "drpc", Desc: "DRPC (storj.io/drpc) over loopback TCP, hand-written description, raw-bytes encoding (no protobuf), one connection per caller (a DRPC connection carries one call at a time)", Serve: serveDRPC, Dial: dialDRPC},
	{Name: "kitex", Desc: "Kitex (cloudwego/kitex) over loopback TCP: its netpoll server and its client's long-connection pool (a connection per caller), Thrift binary with a hand-written FastCodec service as kitex's generator writes it", Serve: serveKitex, Dial: dialKitex},
	{Name: "netrpc", Desc: "net/rpc (gob) over loopback TCP, one client shared by all callers", Serve: serveNetRPC, Dial: dialNetRPC},
	{Name: "shmipc", Desc: shmipcDesc, Serve: serveShmipcEcho, Dial: dialShmipc,
		StreamDesc: shmipcStreamDesc, ServeStream: serveShmipcBulk, DialStream: dialShmipcBulk},
	{Name: "rawshm", Desc: rawSHMDesc, Serve: serveRawSHM, Dial: dialRawSHM},
	{Name: "rawtcp", Desc: "length-prefixed echo over loopback TCP, one connection per caller: the floor", Serve: serveRawTCP, Dial: dialRawTCP,
		StreamDesc: rawTCPStreamDesc, ServeStream: serveRawTCPBulk, DialStream: dialRawTCPBulk},
}

// LookupSystem returns the system called name.
func LookupSystem(name string) (System, error) {
	i := slices.IndexFunc(Systems, func(s System) bool { return s.Name == name })
	if i < 0 {
		return System{}, fmt.Errorf("unknown system %q (have %s)", name, strings.Join(SystemNames(), ", "))
	}
	return Systems[i], nil
}

// openLocal sets s up in this process: its server on a loopback listener, its client
// dialed to it.
func openLocal(s System, size, concurrency int) (Instance, error) {
	if !s.TwoProcess() {
		return s.Open(size, concurrency)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	srv, err := s.Serve(ln)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("serve: %w", err)
	}
	cli, err := s.Dial(ln.Addr().String(), size, concurrency)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("dial: %w", err), srv.Close())
	}
	return &localInstance{Instance: cli, srv: srv}, nil
}

// localInstance is a client and its server in this process.
type localInstance struct {
	Instance
	srv Server
}

// Copied adds the server's count to the client's.
func (l *localInstance) Copied() (uint64, bool) {
	c, ok := l.Instance.Copied()
	s, sok := l.srv.Copied()
	return c + s, ok || sok
}

// Close closes the client, then the server.
func (l *localInstance) Close() error {
	return errors.Join(l.Instance.Close(), l.srv.Close())
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
		return slices.DeleteFunc(slices.Clone(Systems), func(s System) bool { return s.NamedOnly }), nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(SystemNames(), n) {
			if n == ibvSystem {
				return nil, fmt.Errorf("system %s (the cgo ibv provider) is in the harness only when built with -tags ibverbs (make bench-rxe)", ibvSystem)
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

// Notes returns the lines the report's notes get for running systems: what each says
// (System.Note), and, in a build without the ibv provider, that mwrpc-ibv is not in it.
// An error says that one of them cannot run here.
func Notes(systems []System) ([]string, error) {
	var notes []string
	if !slices.ContainsFunc(Systems, func(s System) bool { return s.Name == ibvSystem }) {
		notes = append(notes, "mwrpc over the cgo ibv provider (system "+ibvSystem+") is in the harness only when built with -tags ibverbs (make bench-rxe runs it on Soft-RoCE in a VM).")
	}
	for _, s := range systems {
		if s.Note == nil {
			continue
		}
		n, err := s.Note()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		notes = append(notes, n)
	}
	return notes, nil
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

// PeerWorkers name the creators of goroutines that the peers run in process keep for the
// life of the process (Kitex's and netpoll's workers, shmipc-go's dispatcher, ants'
// default pool, the signal loop that signal.Notify starts): nothing stops them, so a leak
// check of the harness leaves them out and counts mwrpc's own.
var PeerWorkers = []string{"github.com/cloudwego/", "github.com/panjf2000/ants/", "os/signal."}
