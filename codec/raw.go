package codec

import (
	"encoding"
	"fmt"
	"reflect"
)

// Raw is the codec for payloads that are already bytes: the path for bulk data. It
// encodes
//
//   - []byte and *[]byte: the bytes as they are (Append copies them into dst once; build
//     them in dst's memory in the first place to avoid even that);
//   - encoding.BinaryAppender: AppendBinary(dst), in place when dst has room;
//   - encoding.BinaryMarshaler: the result of MarshalBinary (an allocation and a copy).
//
// and decodes into
//
//   - *[]byte: the slice is set to data itself, without a copy. It aliases the transport's
//     memory and is valid only as long as data is: until the handler returns for a
//     request, until Response.Release for a response. Its capacity is clipped to its
//     length, so an append reallocates instead of writing past the payload;
//   - encoding.BinaryUnmarshaler: UnmarshalBinary(data), which must copy what it keeps (as
//     that interface requires).
//
// Anything else is ErrUnsupportedType. Raw implements Sizer for []byte and *[]byte.
//
// Raw allocates nothing itself, but converting a []byte value to an any does (the slice
// header is boxed): pass a *[]byte to Append and Size on hot paths.
type Raw struct{}

var (
	_ Codec = Raw{}
	_ Sizer = Raw{}
)

// Name returns "raw".
func (Raw) Name() string { return "raw" }

// Size returns the length of v's encoding when v is a []byte or a non-nil *[]byte.
func (Raw) Size(v any) (int, bool) {
	switch v := v.(type) {
	case []byte:
		return len(v), true
	case *[]byte:
		if v != nil {
			return len(*v), true
		}
	}
	return 0, false
}

// Append appends v's bytes to dst (see Codec.Append and Raw for the types).
func (Raw) Append(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case []byte:
		return append(dst, v...), nil
	case *[]byte:
		if v != nil {
			return append(dst, *v...), nil
		}
	case encoding.BinaryAppender:
		out, err := v.AppendBinary(dst)
		if err != nil {
			return dst, fmt.Errorf("codec: raw: encoding %T: %w", v, err)
		}
		return out, nil
	case encoding.BinaryMarshaler:
		b, err := v.MarshalBinary()
		if err != nil {
			return dst, fmt.Errorf("codec: raw: encoding %T: %w", v, err)
		}
		return append(dst, b...), nil
	}
	return dst, fmt.Errorf("codec: raw: cannot encode %s: %w (want []byte, *[]byte, encoding.BinaryAppender or encoding.BinaryMarshaler)", typeName(v), ErrUnsupportedType)
}

// Unmarshal points *v at data when v is a *[]byte (no copy: see Raw for how long that
// is valid), or calls v.UnmarshalBinary(data).
func (Raw) Unmarshal(data []byte, v any) error {
	switch v := v.(type) {
	case *[]byte:
		if v != nil {
			*v = data[:len(data):len(data)]
			return nil
		}
	case encoding.BinaryUnmarshaler:
		if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
			break
		}
		if err := v.UnmarshalBinary(data); err != nil {
			return fmt.Errorf("codec: raw: decoding %d bytes into %T: %w: %w", len(data), v, ErrInvalidData, err)
		}
		return nil
	}
	return fmt.Errorf("codec: raw: cannot decode into %s: %w (want *[]byte or encoding.BinaryUnmarshaler)", typeName(v), ErrUnsupportedType)
}
