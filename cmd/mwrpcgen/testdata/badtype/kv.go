// Package badtype is an error case of mwrpcgen (-type KV,Missing,Req,Value,Alias,Fn):
// names that are not interfaces of the package.
package badtype

import "context"

// KV is a valid service.
type KV interface {
	Get(ctx context.Context, req *Req) (*Req, error)
}

// Req is a struct.
type Req struct{}

// Value is a variable.
var Value = 1

// Alias is an alias of KV.
type Alias = KV

// Fn is a function.
func Fn() {}
