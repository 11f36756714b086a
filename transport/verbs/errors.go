package verbs

import (
	"errors"
	"fmt"
)

// Errors returned by verbs calls (as opposed to error statuses in work completions).
// Providers wrap them with detail; match them with errors.Is.
var (
	// ErrInvalid is a bad argument or a call in the wrong state (EINVAL).
	ErrInvalid = errors.New("invalid argument")
	// ErrBusy is a release of an object still in use, such as an MR with a window bound.
	ErrBusy = errors.New("resource busy")
	// ErrClosed is a call on an object that was already released.
	ErrClosed = errors.New("object already released")
	// ErrQueueFull is a post to a full work queue (ENOMEM in libibverbs).
	ErrQueueFull = errors.New("work queue full")
	// ErrNotMapped is an attempt to register memory that did not come from Map.
	ErrNotMapped = errors.New("memory not from verbs.Map")
	// ErrNoMemory is a failure to map or pin memory (ENOMEM), often RLIMIT_MEMLOCK.
	ErrNoMemory = errors.New("cannot allocate or pin memory")
	// ErrUnsupported is a feature the provider or device does not have.
	ErrUnsupported = errors.New("not supported")

	// ErrRemoteAccess is why a QP moved to ERR when a peer's READ, WRITE or
	// SEND_WITH_INV named a key, range or right this side does not grant
	// (IBV_EVENT_QP_ACCESS_ERR). See FaultReporter.
	ErrRemoteAccess = errors.New("a peer's remote access was refused")
	// ErrPeerProtocol is why a QP moved to ERR when the peer sent what its responder
	// cannot take: a malformed frame, a request the QP does not allow, a message whose
	// bytes stopped coming (IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_FATAL). See FaultReporter.
	ErrPeerProtocol = errors.New("the peer broke the wire protocol")
)

// FaultReporter is implemented by queue pairs that can say why they moved to ERR by
// themselves (what libibverbs reports as an affiliated asynchronous event): a consumer
// that sees its receives flush can tell an attack or a broken peer from a peer that left.
type FaultReporter interface {
	// Fault returns why the QP moved to ERR on its own (wrapping ErrRemoteAccess or
	// ErrPeerProtocol), or nil. An event may be reported a moment after the completions
	// it flushed.
	Fault() error
}

// PeerLeftReporter is implemented by queue pairs whose provider can tell a peer that went
// away (the stream the QP runs over ended: the peer closed it, or its process exited) from
// one that stopped answering, as an RDMA CM DISCONNECTED event tells: the work request in
// flight completes with RETRY_EXC_ERR either way.
type PeerLeftReporter interface {
	// PeerLeft reports whether the QP moved to ERR because its peer went away.
	PeerLeft() bool
}

// PostError reports which work request of a PostSend or PostRecv batch was refused.
// Requests before Index were queued; Index and after were not.
type PostError struct {
	Op    string // "post_send", "post_recv" or "post_srq_recv"
	Index int
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("verbs: %s: wr[%d]: %v", e.Op, e.Index, e.Err)
}

// Unwrap returns the cause, so errors.Is(err, ErrInvalid) works.
func (e *PostError) Unwrap() error { return e.Err }
