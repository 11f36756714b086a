// Package benchsvc is the service rpc's benchmarks call through generated stubs.
package benchsvc

import "context"

//go:generate go run github.com/mwrpc/mwrpc/cmd/mwrpcgen -type Bench

// Bench echoes what it gets.
type Bench interface {
	// Small echoes a small struct (msgpack).
	Small(ctx context.Context, m *Small) (*Small, error)
	// Bytes echoes bytes (the raw codec: no encoding).
	Bytes(ctx context.Context, b []byte) ([]byte, error)
}

// Small is a small struct: a key, a 64-byte value and a version.
type Small struct {
	Key     string
	Value   []byte
	Version int64
}

// Echo implements Bench.
type Echo struct{}

// Small returns m.
func (Echo) Small(ctx context.Context, m *Small) (*Small, error) { return m, nil }

// Bytes returns b. b aliases the connection's memory until Bytes returns, and the server
// sends the response before that, so no copy is needed.
func (Echo) Bytes(ctx context.Context, b []byte) ([]byte, error) { return b, nil }
