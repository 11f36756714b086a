package rpc

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/mwrpc/mwrpc/codec"
)

// Status details: typed values a failed call's status carries from the handler to the
// caller, as gRPC's status.WithDetails and errdetails do. A detail is a value of a
// registered type (RegisterDetail); RetryInfo, BadRequest and ErrorInfo are registered.
// Each travels as its registered name and its msgpack encoding; a caller that does not
// know a name gets a *RawDetail.
//
//	st, _ := rpc.NewStatus(rpc.InvalidArgument, "bad key").WithDetails(&rpc.BadRequest{
//		FieldViolations: []rpc.FieldViolation{{Field: "Key", Description: "empty"}}})
//	return nil, st
//
//	// the caller:
//	if br, ok := rpc.DetailOf[*rpc.BadRequest](err); ok { ... }

// RetryInfo says when the caller may retry (gRPC's google.rpc.RetryInfo).
type RetryInfo struct {
	RetryDelay time.Duration
}

// BadRequest lists what was wrong with the request (google.rpc.BadRequest).
type BadRequest struct {
	FieldViolations []FieldViolation
}

// FieldViolation is one field of a request and what is wrong with it.
type FieldViolation struct {
	Field       string // a path to the field: "Items[2].Key"
	Description string
}

// ErrorInfo names the cause of an error in a form a program can act on
// (google.rpc.ErrorInfo).
type ErrorInfo struct {
	Reason   string            // UPPER_SNAKE_CASE, unique within Domain
	Domain   string            // the service or organization that defines Reason
	Metadata map[string]string // more about this occurrence
}

// RawDetail is a detail whose type the receiver has not registered: its name and its
// msgpack encoding.
type RawDetail struct {
	Type  string
	Value []byte
}

// Limits on what a status carries: details beyond them are not sent (the sender's
// WithDetails refuses them) nor accepted (the receiver's envelope parse fails).
const (
	maxDetails     = 64
	maxDetailBytes = 64 << 10
	maxDetailName  = 256
)

var details struct {
	mu     sync.RWMutex
	byName map[string]reflect.Type
	byType map[reflect.Type]string
}

func init() {
	RegisterDetail[*RetryInfo]("mwrpc.RetryInfo")
	RegisterDetail[*BadRequest]("mwrpc.BadRequest")
	RegisterDetail[*ErrorInfo]("mwrpc.ErrorInfo")
}

// RegisterDetail registers T, a pointer to a struct, as a detail type under name (which
// both sides must use: "acme.QuotaFailure"). It panics, as a registration mistake is a
// programming error, if T is not a pointer to a struct, or name or T is taken.
func RegisterDetail[T any](name string) {
	t := reflect.TypeFor[T]()
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct || name == "" || len(name) > maxDetailName {
		panic(fmt.Sprintf("rpc: RegisterDetail[%v](%q): want a pointer to a struct and a name of 1..%d bytes", t, name, maxDetailName))
	}
	details.mu.Lock()
	defer details.mu.Unlock()
	if details.byName == nil {
		details.byName, details.byType = map[string]reflect.Type{}, map[reflect.Type]string{}
	}
	if _, dup := details.byName[name]; dup {
		panic(fmt.Sprintf("rpc: RegisterDetail: %q is already registered", name))
	}
	if old, dup := details.byType[t]; dup {
		panic(fmt.Sprintf("rpc: RegisterDetail: %v is already registered as %q", t, old))
	}
	details.byName[name], details.byType[t] = t, name
}

// wireDetail is one detail as it travels.
type wireDetail struct {
	Type  string
	Value []byte
}

// NewStatus returns a status of code c with msg; add details with WithDetails.
func NewStatus(c Code, msg string) *Status { return &Status{Code: c, Message: msg} }

// WithDetails returns a copy of s that carries ds too, each a value of a registered
// type (or a *RawDetail). It fails, naming the detail, when one is not registered, does
// not encode, or they pass the limits (64 details, 64 KiB).
func (s *Status) WithDetails(ds ...any) (*Status, error) {
	out := *s
	out.details = append(append([]any(nil), s.details...), ds...)
	if _, err := encodeDetails(out.details); err != nil {
		return nil, err
	}
	return &out, nil
}

// Details returns the status's details: values of the registered types, a *RawDetail for
// a name this side has not registered.
func (s *Status) Details() []any { return append([]any(nil), s.details...) }

// DetailOf returns the first detail of type T that err's status carries.
func DetailOf[T any](err error) (T, bool) {
	var s *Status
	if errors.As(err, &s) {
		for _, d := range s.details {
			if v, ok := d.(T); ok {
				return v, true
			}
		}
	}
	var zero T
	return zero, false
}

// encodeDetails encodes ds for the envelope (nil for none).
func encodeDetails(ds []any) ([]byte, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	if len(ds) > maxDetails {
		return nil, fmt.Errorf("rpc: %d status details, over %d", len(ds), maxDetails)
	}
	ws := make([]wireDetail, len(ds))
	details.mu.RLock()
	for i, d := range ds {
		if raw, ok := d.(*RawDetail); ok {
			ws[i] = wireDetail{Type: raw.Type, Value: raw.Value}
			continue
		}
		name, ok := details.byType[reflect.TypeOf(d)]
		if !ok {
			details.mu.RUnlock()
			return nil, fmt.Errorf("rpc: status detail %d: %T is not a registered detail type (RegisterDetail)", i, d)
		}
		v, err := codec.Msgpack{}.Append(nil, d)
		if err != nil {
			details.mu.RUnlock()
			return nil, fmt.Errorf("rpc: status detail %d (%s): %w", i, name, err)
		}
		ws[i] = wireDetail{Type: name, Value: v}
	}
	details.mu.RUnlock()
	b, err := codec.Msgpack{}.Append(nil, ws)
	if err == nil && len(b) > maxDetailBytes {
		err = fmt.Errorf("rpc: status details of %d bytes, over %d", len(b), maxDetailBytes)
	}
	return b, err
}

// decodeDetails decodes a details section from a peer: registered names become their
// types, others (and values that do not decode) *RawDetail.
func decodeDetails(b []byte) ([]any, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var ws []wireDetail
	if err := (codec.Msgpack{}).Unmarshal(b, &ws); err != nil {
		return nil, fmt.Errorf("%w: status details: %w", errEnvelope, err)
	}
	if len(ws) > maxDetails {
		return nil, fmt.Errorf("%w: %d status details, over %d", errEnvelope, len(ws), maxDetails)
	}
	out := make([]any, len(ws))
	details.mu.RLock()
	defer details.mu.RUnlock()
	for i, w := range ws {
		out[i] = &RawDetail{Type: w.Type, Value: w.Value}
		if t, ok := details.byName[w.Type]; ok {
			v := reflect.New(t.Elem())
			if (codec.Msgpack{}).Unmarshal(w.Value, v.Interface()) == nil {
				out[i] = v.Interface()
			}
		}
	}
	return out, nil
}
