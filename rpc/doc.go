// Package rpc turns the transport into the framework people use: services are plain Go
// interfaces, cmd/mwrpcgen writes their clients and server dispatch, and calls carry
// deadlines, cancellation, metadata and gRPC-style status codes.
//
//	type KV interface {
//		Get(ctx context.Context, req *GetReq) (*GetResp, error)
//	}
//
// A server registers an implementation (RegisterKV(srv, impl), generated) and serves on a
// listener; a client dials one or more addresses and calls through the generated stub
// (NewKVClient(client)). Request and response values are encoded with a codec (msgpack by
// default; methods on []byte use the raw codec, so bulk data is never re-encoded).
//
// Lifetimes: a []byte request a handler receives aliases the connection's registered memory
// and is valid until the handler returns; copy what you keep. A []byte response a client
// receives is its own copy, unless WithLentResponses lends it (until Client.Release). Every
// rule is in the README's Buffer lifetimes section:
// https://github.com/mwrpc/mwrpc#buffer-lifetimes
package rpc
