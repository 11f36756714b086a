// Package api is a golden case of mwrpcgen (marker): a //mwrpc:service line that names
// the service on the wire, so that two packages called api do not collide.
package api

import "context"

// Greeter greets.
//
//mwrpc:service acme.greeter.v1.Greeter
type Greeter interface {
	Hello(ctx context.Context, req *HelloRequest) (*HelloReply, error)
}

// HelloRequest names who to greet.
type HelloRequest struct{ Name string }

// HelloReply is the greeting.
type HelloReply struct{ Message string }
