// Package raw is a golden case of mwrpcgen (-type Store): methods on []byte, which use
// the raw codec only when both their request and their response are []byte.
package raw

import "context"

// Store keeps blobs.
type Store interface {
	// Put takes and returns bytes: raw codec.
	Put(ctx context.Context, data []byte) ([]byte, error)
	// Echo spells []byte as []uint8: raw codec too.
	Echo(ctx context.Context, data []uint8) ([]uint8, error)
	// Copy goes through an alias of []byte: raw codec too.
	Copy(ctx context.Context, b Bytes) (Bytes, error)
	// Get returns bytes for a string: the default codec.
	Get(ctx context.Context, key string) ([]byte, error)
	// Stat takes bytes and returns a struct: the default codec.
	Stat(ctx context.Context, data []byte) (*Info, error)
}

// Bytes is an alias of []byte.
type Bytes = []byte

// Info describes a blob.
type Info struct{ Size int }
