package rpc

// Server serves registered services (being written: this stub lets generated code build).
type Server struct{}

// RegisterService registers impl, which must implement sd.HandlerType.
func (s *Server) RegisterService(sd *ServiceDesc, impl any) {}
