package rpc

import (
	"slices"
	"strings"

	"github.com/mwrpc/mwrpc/codec"
)

// ServiceInfo is one service registered on a Server, as ServiceInfo reports it: what
// server reflection (package rpc/reflection) describes.
type ServiceInfo struct {
	// Desc is the description the service was registered with. It is the registrant's:
	// read it, do not change it.
	Desc *ServiceDesc
	// Codec encodes the requests and responses of the methods whose MethodDesc or
	// StreamDesc names none: the server's codec (WithCodec; msgpack by default).
	Codec codec.Codec
}

// ServiceInfo returns the services registered on s, sorted by name.
func (s *Server) ServiceInfo() []ServiceInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ServiceInfo, len(s.services))
	for i, sd := range s.services {
		out[i] = ServiceInfo{Desc: sd, Codec: s.opts.codec}
	}
	slices.SortFunc(out, func(a, b ServiceInfo) int { return strings.Compare(a.Desc.ServiceName, b.Desc.ServiceName) })
	return out
}
