// Package loopback is an rpc.Invoker for the tests of generated code: it runs each call
// through the service descriptor of an implementation in the same process, encoding the
// request and the response with the method's codec, as a client and a server would.
package loopback

import (
	"context"
	"fmt"
	"reflect"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/rpc"
)

// Conn is the loopback Invoker.
type Conn struct {
	// Interceptor, if set, wraps every call on the server side.
	Interceptor rpc.UnaryServerInterceptor

	methods map[string]entry
}

type entry struct {
	impl any
	desc rpc.MethodDesc
}

// RegisterService serves impl, which must implement sd.HandlerType, on c.
func (c *Conn) RegisterService(sd *rpc.ServiceDesc, impl any) {
	if want := reflect.TypeOf(sd.HandlerType).Elem(); !reflect.TypeOf(impl).Implements(want) {
		panic(fmt.Sprintf("loopback: %T does not implement %v", impl, want))
	}
	if c.methods == nil {
		c.methods = make(map[string]entry)
	}
	for _, m := range sd.Methods {
		c.methods["/"+sd.ServiceName+"/"+m.MethodName] = entry{impl: impl, desc: m}
	}
}

// Invoke implements rpc.Invoker.
func (c *Conn) Invoke(ctx context.Context, method string, req, reply any, _ ...rpc.CallOption) error {
	e, ok := c.methods[method]
	if !ok {
		return fmt.Errorf("loopback: no method %s", method)
	}
	var cd codec.Codec = codec.Msgpack{}
	if e.desc.Codec != nil {
		cd = e.desc.Codec
	}
	data, err := cd.Append(nil, req)
	if err != nil {
		return fmt.Errorf("loopback: encoding the request of %s: %w", method, err)
	}
	dec := func(v any) error { return cd.Unmarshal(data, v) }
	resp, err := e.desc.Handler(e.impl, ctx, dec, c.Interceptor)
	if err != nil {
		return err
	}
	out, err := cd.Append(nil, resp)
	if err != nil {
		return fmt.Errorf("loopback: encoding the response of %s: %w", method, err)
	}
	return cd.Unmarshal(out, reply)
}
