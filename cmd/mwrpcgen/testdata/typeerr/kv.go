// Package typeerr is an error case of mwrpcgen (-type KV): a service whose declaration
// does not type-check. The type errors are reported, except those about names mwrpcgen
// is about to generate.
package typeerr

import (
	"context"

	"github.com/mwrpc/mwrpc/rpc"
)

// KV uses an undefined type.
type KV interface {
	Get(ctx context.Context, req *Undefined) (*Resp, error)
	Put(ctx context.Context, req *Resp) (*Resp, error)
}

// Resp is a response.
type Resp struct{}

// Serve uses a generated name (not reported) and has a type error of its own (reported).
func Serve(s *rpc.Server, impl KV) {
	RegisterKV(s, impl)
	var n int = "one"
	_ = n
}
