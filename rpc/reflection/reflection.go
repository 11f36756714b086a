// Package reflection is server reflection: a service that tells a caller which services a
// server has, their methods and stream kinds, and the fields of their request and
// response types, so that a generic client (cmd/mwrpc, like grpcurl for gRPC) can list
// them and call any method with JSON. Register adds it to an rpc.Server in one line:
//
//	reflection.Register(srv)
//
// Its wire name is mwrpc.reflection.v1.Reflection. It describes the services registered
// on the server when it is asked, itself included. Register it only where telling
// callers the server's API is acceptable: it reveals names and types, never data.
package reflection

import (
	"context"
	"fmt"
	"strings"

	"github.com/mwrpc/mwrpc/rpc"
)

//go:generate go run github.com/mwrpc/mwrpc/cmd/mwrpcgen -type Reflection

// Reflection describes the services of the server it is registered on.
//
//mwrpc:service mwrpc.reflection.v1.Reflection
type Reflection interface {
	// ListServices returns the full names of the server's services, sorted.
	ListServices(ctx context.Context, req *ListRequest) (*ListResponse, error)
	// DescribeService describes one service; an unknown name fails with NotFound.
	DescribeService(ctx context.Context, req *DescribeRequest) (*ServiceDescriptor, error)
}

// ListRequest asks for the server's services.
type ListRequest struct{}

// ListResponse names the server's services ("kvservice.KV"), sorted.
type ListResponse struct {
	Services []string
}

// DescribeRequest names the service to describe, by its full name.
type DescribeRequest struct {
	Service string
}

// Server implements Reflection over the services registered on an rpc.Server.
type Server struct {
	srv *rpc.Server
}

var _ Reflection = (*Server)(nil)

// Register registers the reflection service on srv and returns it.
func Register(srv *rpc.Server) *Server {
	r := &Server{srv: srv}
	RegisterReflection(srv, r)
	return r
}

// ListServices returns the names of the services registered on the server.
func (r *Server) ListServices(ctx context.Context, req *ListRequest) (*ListResponse, error) {
	infos := r.srv.ServiceInfo()
	out := &ListResponse{Services: make([]string, len(infos))}
	for i, si := range infos {
		out.Services[i] = si.Desc.ServiceName
	}
	return out, nil
}

// DescribeService describes the service req names.
func (r *Server) DescribeService(ctx context.Context, req *DescribeRequest) (*ServiceDescriptor, error) {
	infos := r.srv.ServiceInfo()
	names := make([]string, len(infos))
	for i, si := range infos {
		if si.Desc.ServiceName == req.Service {
			return Describe(si), nil
		}
		names[i] = si.Desc.ServiceName
	}
	return nil, rpc.Errorf(rpc.NotFound, "reflection: no service %q on this server (it has %s)", req.Service, strings.Join(names, ", "))
}

// FindMethod returns the method of d named name, or an error naming those it has.
func (d *ServiceDescriptor) FindMethod(name string) (*MethodDescriptor, error) {
	names := make([]string, len(d.Methods))
	for i := range d.Methods {
		if d.Methods[i].Name == name {
			return &d.Methods[i], nil
		}
		names[i] = d.Methods[i].Name
	}
	return nil, fmt.Errorf("service %s has no method %q (it has %s)", d.Name, name, strings.Join(names, ", "))
}

// Struct returns the struct type named name in d, or nil.
func (d *ServiceDescriptor) Struct(name string) *StructDescriptor {
	for i := range d.Structs {
		if d.Structs[i].Name == name {
			return &d.Structs[i]
		}
	}
	return nil
}
