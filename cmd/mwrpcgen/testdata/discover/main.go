package discover

import "github.com/mwrpc/mwrpc/rpc"

// Serve uses what mwrpcgen generates; before the first run these are type errors, which
// must not stop it.
func Serve(s *rpc.Server, g Greeter, c Counter, k Clock, cc rpc.Invoker) Greeter {
	RegisterGreeter(s, g)
	RegisterCounter(s, c)
	RegisterClock(s, k)
	return NewGreeterClient(cc)
}
