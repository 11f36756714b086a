package rpc

import (
	"context"

	"github.com/mwrpc/mwrpc/codec"
)

// ServiceDesc describes a service for Server.RegisterService. The generator
// (cmd/mwrpcgen) writes one per service interface.
type ServiceDesc struct {
	// ServiceName is the service's full name, "<package>.<Interface>", for example
	// "kv.KV". Methods are called as "/<ServiceName>/<MethodName>".
	ServiceName string
	// HandlerType is a nil pointer to the service interface, (*KV)(nil): RegisterService
	// checks that the implementation satisfies it.
	HandlerType any
	// Methods are the unary methods of the service.
	Methods []MethodDesc
	// Streams are its streaming methods.
	Streams []StreamDesc
}

// MethodDesc describes one method.
type MethodDesc struct {
	MethodName string
	Handler    MethodHandler
	// Codec encodes this method's request and response; nil means the server's codec
	// (msgpack by default). The generator sets codec.Raw{} for methods whose request and
	// response are both []byte, so bulk data is never copied by a codec.
	Codec codec.Codec
	// BytesHandler, set by the generator for methods on []byte both ways, calls the
	// implementation without boxing the request or response; the server uses it when no
	// interceptor is installed.
	BytesHandler func(srv any, ctx context.Context, req []byte) ([]byte, error)
}

// MethodHandler runs one call: it decodes the request with dec, then calls the
// implementation srv directly or through the interceptor.
type MethodHandler func(srv any, ctx context.Context, dec func(any) error, interceptor UnaryServerInterceptor) (any, error)

// UnaryServerInfo describes a call to server interceptors.
type UnaryServerInfo struct {
	Server     any    // the implementation
	FullMethod string // "/kv.KV/Get"
}

// UnaryHandler is the next step of a server interceptor chain: the method itself.
type UnaryHandler func(ctx context.Context, req any) (any, error)

// UnaryServerInterceptor wraps every call a server runs (logging, auth, metrics).
type UnaryServerInterceptor func(ctx context.Context, req any, info *UnaryServerInfo, handler UnaryHandler) (any, error)

// UnaryInvoker is the next step of a client interceptor chain: the call itself.
type UnaryInvoker func(ctx context.Context, method string, req, reply any, opts ...CallOption) error

// UnaryClientInterceptor wraps every call a client makes.
type UnaryClientInterceptor func(ctx context.Context, method string, req, reply any, invoker UnaryInvoker, opts ...CallOption) error

// BytesInvoker is the allocation-free path of methods on []byte both ways: generated
// clients use it when their Invoker has it (*Client does). The response is the caller's.
type BytesInvoker interface {
	InvokeBytes(ctx context.Context, method string, req []byte) ([]byte, error)
}

// Invoker is what generated clients call: *Client implements it, and so can a test fake.
type Invoker interface {
	// Invoke calls method ("/kv.KV/Get") with req and decodes the response into reply
	// (a pointer). The error is a *Status: match it with errors.Is(err, rpc.ErrNotFound)
	// or read its code with rpc.CodeOf(err).
	Invoke(ctx context.Context, method string, req, reply any, opts ...CallOption) error
}
