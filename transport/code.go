package transport

import "fmt"

// Code is a call's status code, with gRPC's names and numbers. It is the one code type of
// the module: rpc.Code is this type, so a code crosses from a handler through the transport
// to the caller unchanged. The transport itself produces the codes named Status* below;
// handlers may return any.
type Code uint16

// Status codes the transport itself produces (the rpc package names the whole set).
const (
	StatusOK                Code = 0
	StatusCanceled          Code = 1
	StatusResourceExhausted Code = 8
	StatusUnimplemented     Code = 12
	StatusInternal          Code = 13
	StatusUnavailable       Code = 14
)

var codeNames = [...]string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
	"Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}

// String returns the code's name, for example "NotFound".
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", uint16(c))
}

// coder is an error that stands for a status code: rpc.Status, and the transport's
// sentinels that have one (ErrUnavailable).
type coder interface{ StatusCode() Code }

// codeError is a sentinel error that is also a status code: errors.Is matches it against
// any error of the same code that says so (rpc.ErrUnavailable, or a Status with code
// Unavailable a server sent), in both directions.
type codeError struct {
	code Code
	msg  string
}

func (e *codeError) Error() string { return e.msg }

// StatusCode returns the code the error stands for.
func (e *codeError) StatusCode() Code { return e.code }

// Is reports whether target stands for the same code (rpc.ErrUnavailable does).
func (e *codeError) Is(target error) bool {
	t, ok := target.(coder)
	return ok && t.StatusCode() == e.code
}
