// Package kvservice is the example key-value service: a plain Go interface, its types,
// and an in-memory implementation. kv_mwrpc.go is generated from it.
package kvservice

import "context"

//go:generate go run github.com/mwrpc/mwrpc/cmd/mwrpcgen -type KV

// KV is a key-value store.
type KV interface {
	// Get returns the value of a key, or a NotFound error.
	Get(ctx context.Context, req *GetRequest) (*GetResponse, error)
	// Put stores a value and returns the key's new version.
	Put(ctx context.Context, req *PutRequest) (*PutResponse, error)
	// Delete removes a key; deleting a missing key is not an error.
	Delete(ctx context.Context, req *DeleteRequest) (*DeleteResponse, error)
}

// GetRequest asks for one key.
type GetRequest struct {
	Key string
}

// GetResponse carries a value and its version.
type GetResponse struct {
	Value   []byte
	Version int64
}

// PutRequest stores Value under Key.
type PutRequest struct {
	Key   string
	Value []byte
}

// PutResponse reports the version the value got.
type PutResponse struct {
	Version int64
}

// DeleteRequest removes Key.
type DeleteRequest struct {
	Key string
}

// DeleteResponse reports whether the key existed.
type DeleteResponse struct {
	Existed bool
}
