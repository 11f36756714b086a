// Package badsvc is an error case of mwrpcgen without -type: marked types that cannot be
// services, and generated names that collide.
package badsvc

import "context"

//mwrpc:service
type NotIface struct{}

//mwrpc:service
type Generic[T any] interface {
	Get(ctx context.Context, req T) (T, error)
}

//mwrpc:service
type Empty interface{}

//mwrpc:service
type Constraint interface {
	~int
	Get(ctx context.Context, req *Req) (*Req, error)
}

//mwrpc:service
type lower interface {
	Get(ctx context.Context, req *Req) (*Req, error)
}

//mwrpc:service
type Alias = KV

//mwrpc:service
type KV interface {
	Get(ctx context.Context, req *Req) (*Req, error)
}

// KVClient is what mwrpcgen would generate for KV.
type KVClient struct{}

//mwrpc:service
type Dup interface {
	X_Y(ctx context.Context, req *Req) (*Req, error)
}

//mwrpc:service
type Dup_X interface {
	Y(ctx context.Context, req *Req) (*Req, error)
}

// Req is a request.
type Req struct{}

// in is a type named like a local variable of the generated code.
type in struct{}

//mwrpc:service
type Local interface {
	Get(ctx context.Context, req *in) (*Req, error)
}

// BadName names itself with a slash.
//
//mwrpc:service acme/BadName
type BadName interface {
	Get(ctx context.Context, req *struct{}) (*struct{}, error)
}
