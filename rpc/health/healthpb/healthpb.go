// Package healthpb holds the messages of the health service (package
// github.com/mwrpc/mwrpc/rpc/health), which has the semantics of gRPC's grpc.health.v1.
// It imports nothing of mwrpc, so that both the service and the rpc client's health
// checking (rpc.WithHealthCheck) can use them: one definition, one encoding. Most code
// uses them through the aliases in package health.
package healthpb

import "strconv"

// ServingStatus is the health of a service: grpc.health.v1's
// HealthCheckResponse.ServingStatus, with the same numbers.
type ServingStatus int32

// The serving statuses. String gives their grpc.health.v1 names (SERVING, ...).
const (
	// Unknown is the zero value: no status was set.
	Unknown ServingStatus = 0
	// Serving: the service takes calls.
	Serving ServingStatus = 1
	// NotServing: the service should not be sent calls.
	NotServing ServingStatus = 2
	// ServiceUnknown: the server knows no status for the service (Watch only; Check
	// fails with NotFound instead).
	ServiceUnknown ServingStatus = 3
)

// String returns the grpc.health.v1 name of s ("SERVING"), or the number of a status
// this package does not know.
func (s ServingStatus) String() string {
	switch s {
	case Unknown:
		return "UNKNOWN"
	case Serving:
		return "SERVING"
	case NotServing:
		return "NOT_SERVING"
	case ServiceUnknown:
		return "SERVICE_UNKNOWN"
	}
	return "ServingStatus(" + strconv.Itoa(int(s)) + ")"
}

// CheckRequest names the service whose health is asked; "" is the whole server.
type CheckRequest struct {
	Service string
}

// CheckResponse is a service's health.
type CheckResponse struct {
	Status ServingStatus
}
