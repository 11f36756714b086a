// Package echo is the service the harness calls over mwrpc: one method that returns its
// request. The client stub and server dispatch in echo_mwrpc.go are written by
// cmd/mwrpcgen; run go generate after changing the interface.
package echo

import "context"

//go:generate go run github.com/mwrpc/mwrpc/cmd/mwrpcgen -type Bench

// Bench is the benchmark service. Echo takes and returns []byte, so mwrpc carries it with
// the raw codec: no encoding step on either side.
type Bench interface {
	// Echo returns data.
	Echo(ctx context.Context, data []byte) ([]byte, error)
}

// Server implements Bench. Its Echo returns the request itself: the slice aliases the
// connection's registered memory, which stays valid until the handler returns, and the
// server encodes the response before then.
type Server struct{}

// Echo returns data.
func (Server) Echo(_ context.Context, data []byte) ([]byte, error) { return data, nil }
