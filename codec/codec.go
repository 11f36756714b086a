package codec

import "errors"

// Codec encodes values into payloads and decodes payloads into values. Implementations are
// safe for concurrent use.
type Codec interface {
	// Name identifies the encoding ("msgpack", "raw"), for example in call metadata. Codecs
	// whose outputs decode the same way share a name.
	Name() string

	// Append appends the encoding of v to dst and returns the extended slice, following
	// append's rules: when cap(dst)-len(dst) is enough, the encoding is written in place in
	// dst's array; otherwise it lands in a newly allocated array that also holds dst's
	// bytes. On error Append returns dst (bytes past len(dst) may have been overwritten).
	//
	// This is what lets an encoding be built directly in registered memory without knowing
	// its size in advance:
	//
	//	buf, err := w.Buffer(hint)           // registered memory
	//	out, err := c.Append(buf[:0], resp)  // in place when it fits
	//	err = w.Write(status, out)           // no copy if out is still in buf, else one copy
	//
	// A Codec that implements Sizer gives an exact hint; otherwise keep a running estimate
	// (for example the largest recent encoding of the method).
	Append(dst []byte, v any) ([]byte, error)

	// Unmarshal decodes data into v, which must be a non-nil pointer (or another type the
	// codec documents). Whether the result may alias data depends on the codec: see its
	// documentation and the package's Lifetimes section.
	Unmarshal(data []byte, v any) error
}

// LimitAppender is implemented by codecs that can stop encoding as soon as the output
// would pass a limit, so that refusing an oversized value costs as little as the part
// encoded before the limit, not the whole value.
type LimitAppender interface {
	// AppendLimit is Append, but fails with ErrTooLarge once len(dst) would pass limit.
	AppendLimit(dst []byte, v any, limit int) ([]byte, error)
}

// Sizer is implemented by codecs that can tell the exact length of an encoding without
// producing it (Raw can, Msgpack cannot). ok is false when the length of v's encoding is
// not known in advance.
type Sizer interface {
	Size(v any) (n int, ok bool)
}

// Errors of the codecs; match them with errors.Is. The errors returned wrap one of these
// (and, where there is one, the underlying error), and their messages name the Go type
// involved.
var (
	// ErrUnsupportedType is returned for a value the codec cannot encode, or a destination
	// it cannot decode into: for Raw anything but the documented types; for Msgpack a
	// destination that is not a non-nil pointer, and types msgpack has no encoding for
	// (channels, functions, ...).
	ErrUnsupportedType = errors.New("unsupported type")

	// ErrInvalidData is returned when data is not a valid encoding of a value of the
	// destination's type: truncated or malformed input, trailing bytes, nesting beyond the
	// limit, or a type mismatch.
	ErrInvalidData = errors.New("invalid data")
	// ErrTooLarge is returned by AppendLimit for a value whose encoding passes the limit.
	ErrTooLarge = errors.New("encoding too large")
)
