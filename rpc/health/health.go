// Package health is a health service with the semantics of gRPC's grpc.health.v1.Health:
// Check asks for a service's serving status, Watch follows it. Register adds it to an
// rpc.Server in one line, and the returned *Server sets the statuses:
//
//	hs := health.Register(srv)           // "" (the whole server) is SERVING
//	hs.SetServingStatus("kv.KV", health.NotServing)
//
// A client that passes rpc.WithHealthCheck(service) watches the status on each of its
// connections and sends no calls to an endpoint whose last status was not SERVING. The
// wire name is grpc.health.v1.Health, its methods Check and Watch (see docs/health.md).
package health

import (
	"context"
	"iter"
	"log/slog"
	"sync"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/health/healthpb"
)

//go:generate go run github.com/mwrpc/mwrpc/cmd/mwrpcgen -type Health

// The messages, defined in package healthpb (which the rpc client's health checking
// shares) and named here for the service's users.
type (
	// CheckRequest names the service whose health is asked; "" is the whole server.
	CheckRequest = healthpb.CheckRequest
	// CheckResponse is a service's health.
	CheckResponse = healthpb.CheckResponse
	// ServingStatus is the health of a service (grpc.health.v1's ServingStatus).
	ServingStatus = healthpb.ServingStatus
)

// The serving statuses, with grpc.health.v1's numbers; String gives their names there
// (UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN).
const (
	Unknown        = healthpb.Unknown        // no status was set
	Serving        = healthpb.Serving        // the service takes calls
	NotServing     = healthpb.NotServing     // the service should not be sent calls
	ServiceUnknown = healthpb.ServiceUnknown // Watch of a service with no status
)

// Health is the health service, grpc.health.v1.Health on the wire.
//
//mwrpc:service grpc.health.v1.Health
type Health interface {
	// Check returns the service's serving status; a service with none fails with
	// NotFound.
	Check(ctx context.Context, req *CheckRequest) (*CheckResponse, error)
	// Watch sends the service's serving status at once, then each change, until the
	// caller goes or the server stops. A service with no status is SERVICE_UNKNOWN, and
	// is watched still: setting its status later sends it.
	Watch(ctx context.Context, req *CheckRequest) iter.Seq2[*CheckResponse, error]
}

// Server implements Health: it keeps a serving status per service name and tells
// watchers of their changes. The zero value is not usable; use NewServer or Register.
// It is safe for concurrent use.
type Server struct {
	mu       sync.Mutex
	shutdown bool
	statuses map[string]ServingStatus
	watchers map[string]map[*watcher]struct{}
}

// watcher is one Watch call: ch holds at most the latest status it has not yet sent,
// so that a slow watcher never holds up SetServingStatus.
type watcher struct {
	ch chan ServingStatus
}

var _ Health = (*Server)(nil)

// NewServer returns a health server whose only status is the whole server's (""),
// SERVING.
func NewServer() *Server {
	return &Server{
		statuses: map[string]ServingStatus{"": Serving},
		watchers: make(map[string]map[*watcher]struct{}),
	}
}

// Register registers a new health server (NewServer) on srv as service
// grpc.health.v1.Health, and returns it to set statuses with. Like RegisterService, it
// must come before srv serves.
func Register(srv *rpc.Server) *Server {
	hs := NewServer()
	RegisterHealth(srv, hs)
	return hs
}

// SetServingStatus sets the serving status of service ("" is the whole server) and
// sends it to the service's watchers. After Shutdown it is ignored, until Resume.
func (s *Server) SetServingStatus(service string, status ServingStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		slog.Debug("health: SetServingStatus ignored after Shutdown", "service", service, "status", status)
		return
	}
	s.setLocked(service, status)
}

// Shutdown sets every status to NOT_SERVING and ignores SetServingStatus until Resume:
// call it when the server begins to stop, so that clients that check health go
// elsewhere first. It does not end Watch calls.
func (s *Server) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdown = true
	for service := range s.statuses {
		s.setLocked(service, NotServing)
	}
}

// Resume sets every status to SERVING and takes SetServingStatus again.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdown = false
	for service := range s.statuses {
		s.setLocked(service, Serving)
	}
}

// setLocked records status and hands it to each watcher of service, replacing any
// status the watcher has not sent yet. The caller holds mu.
func (s *Server) setLocked(service string, status ServingStatus) {
	s.statuses[service] = status
	for w := range s.watchers[service] {
		select {
		case <-w.ch: // not sent yet: superseded
		default:
		}
		w.ch <- status // room for one, and only setters (holding mu) fill it
	}
}

// Check returns the serving status of req.Service, or NotFound when it has none.
func (s *Server) Check(ctx context.Context, req *CheckRequest) (*CheckResponse, error) {
	s.mu.Lock()
	status, ok := s.statuses[req.Service]
	s.mu.Unlock()
	if !ok {
		return nil, rpc.Errorf(rpc.NotFound, "health: unknown service %q", req.Service)
	}
	return &CheckResponse{Status: status}, nil
}

// Watch yields the serving status of req.Service (SERVICE_UNKNOWN if it has none) at
// once, then each change, until ctx ends or the caller stops. A watcher that falls
// behind gets the latest status only, never a backlog.
func (s *Server) Watch(ctx context.Context, req *CheckRequest) iter.Seq2[*CheckResponse, error] {
	return func(yield func(*CheckResponse, error) bool) {
		w := &watcher{ch: make(chan ServingStatus, 1)}
		s.mu.Lock()
		status, ok := s.statuses[req.Service]
		if !ok {
			status = ServiceUnknown
		}
		ws := s.watchers[req.Service]
		if ws == nil {
			ws = make(map[*watcher]struct{})
			s.watchers[req.Service] = ws
		}
		ws[w] = struct{}{}
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(ws, w)
			if len(ws) == 0 {
				delete(s.watchers, req.Service)
			}
			s.mu.Unlock()
		}()
		sent := status
		if !yield(&CheckResponse{Status: status}, nil) {
			return
		}
		for {
			select {
			case status = <-w.ch:
			case <-ctx.Done():
				return
			}
			if status == sent {
				continue // changed and back before this watcher sent it
			}
			sent = status
			if !yield(&CheckResponse{Status: status}, nil) {
				return
			}
		}
	}
}
