package rpc

import (
	"context"
	"errors"
	"fmt"

	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport"
)

// Code is a status code, with gRPC's names and numbers. It is transport.Code: the one
// code type of the module, which a handler's status keeps from the server to the caller.
type Code = transport.Code

// Status codes.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

// Status is the error of a failed call: a code, a message and typed details
// (WithDetails). It crosses the wire.
type Status struct {
	Code    Code
	Message string
	cause   error // the local error it was made from, if any
	details []any // typed details (WithDetails, Details)
}

// Error formats the status as gRPC does.
func (s *Status) Error() string {
	return fmt.Sprintf("rpc error: code = %v desc = %s", s.Code, s.Message)
}

// Is matches another *Status with the same code and, if the target has one, the same
// message: errors.Is(err, rpc.ErrNotFound) is true for any NotFound status.
// A transport error that stands for a code (transport.ErrUnavailable) matches any status
// of that code too, so there is one ErrUnavailable whichever package names it.
func (s *Status) Is(target error) bool {
	switch t := target.(type) {
	case *Status:
		return t.Code == s.Code && (t.Message == "" || t.Message == s.Message)
	case interface{ StatusCode() Code }:
		return t.StatusCode() == s.Code
	}
	return false
}

// StatusCode returns s.Code: a Status stands for its code, and transport.ErrUnavailable
// matches rpc.ErrUnavailable through it.
func (s *Status) StatusCode() Code { return s.Code }

// Unwrap returns the local error the status was made from (a context error, a transport
// error), so errors.Is(err, context.DeadlineExceeded) also works.
func (s *Status) Unwrap() error { return s.cause }

// Sentinels to match errors against with errors.Is, one per code.
var (
	ErrCanceled           = &Status{Code: Canceled}
	ErrUnknown            = &Status{Code: Unknown}
	ErrInvalidArgument    = &Status{Code: InvalidArgument}
	ErrDeadlineExceeded   = &Status{Code: DeadlineExceeded}
	ErrNotFound           = &Status{Code: NotFound}
	ErrAlreadyExists      = &Status{Code: AlreadyExists}
	ErrPermissionDenied   = &Status{Code: PermissionDenied}
	ErrResourceExhausted  = &Status{Code: ResourceExhausted}
	ErrFailedPrecondition = &Status{Code: FailedPrecondition}
	ErrAborted            = &Status{Code: Aborted}
	ErrOutOfRange         = &Status{Code: OutOfRange}
	ErrUnimplemented      = &Status{Code: Unimplemented}
	ErrInternal           = &Status{Code: Internal}
	ErrUnavailable        = &Status{Code: Unavailable}
	ErrDataLoss           = &Status{Code: DataLoss}
	ErrUnauthenticated    = &Status{Code: Unauthenticated}
)

// Errorf returns a *Status error; a handler returns it to send that code. Code OK gives nil.
func Errorf(c Code, format string, a ...any) error {
	if c == OK {
		return nil
	}
	return &Status{Code: c, Message: fmt.Sprintf(format, a...)}
}

// StatusOf converts any error to a status: nil is OK, a *Status (anywhere in the chain) is
// itself, context errors are Canceled or DeadlineExceeded, a failed connection is
// Unavailable, a message over the size limit is ResourceExhausted, anything else Unknown.
func StatusOf(err error) *Status {
	var s *Status
	switch {
	case err == nil:
		return &Status{Code: OK}
	case errors.As(err, &s):
		return s
	case errors.Is(err, context.DeadlineExceeded):
		return &Status{Code: DeadlineExceeded, Message: err.Error(), cause: err}
	case errors.Is(err, context.Canceled):
		return &Status{Code: Canceled, Message: err.Error(), cause: err}
	case errors.Is(err, transport.ErrTooLarge), errors.Is(err, pool.ErrPoolExhausted):
		return &Status{Code: ResourceExhausted, Message: err.Error(), cause: err}
	case errors.Is(err, transport.ErrUnavailable), errors.Is(err, transport.ErrHandshake):
		return &Status{Code: Unavailable, Message: err.Error(), cause: err}
	}
	return &Status{Code: Unknown, Message: err.Error(), cause: err}
}

// CodeOf returns the code of err (OK for nil).
func CodeOf(err error) Code { return StatusOf(err).Code }
