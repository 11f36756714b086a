// Package rpc has the same name as github.com/mwrpc/mwrpc/rpc, which generated code
// imports as rpc.
package rpc

// Req is a request.
type Req struct{ Method string }
