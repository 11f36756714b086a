package codec

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// Msgpack is the default codec: MessagePack (github.com/vmihailenco/msgpack/v5). The zero
// value encodes structs as maps keyed by field name, so that fields can be added and
// removed independently on each side, as with JSON. Struct tags `msgpack:"name,omitempty"`
// and the library's Marshaler, CustomEncoder and extension types apply as usual.
//
// Encoders and decoders are pooled and reset for every call: Append allocates nothing for
// plain structs (unless dst must grow), and Unmarshal allocates what the value needs (one
// allocation per string and per []byte field, plus maps, slices and pointers) and, for
// payloads up to 64 KiB, nothing for its own state. Append does not detect cycles: a
// value that refers to itself recurses until the stack overflows, as in msgpack itself.
//
// Unmarshal accepts exactly one MessagePack value spanning all of data. Before decoding it
// checks that data is well formed: truncated input, the reserved code 0xc1, lengths past
// the end of data, trailing bytes and arrays or maps nested more than 1000 deep are
// ErrInvalidData, so hostile input can neither make the decoder allocate more than about
// len(data) elements nor exhaust the stack. Unmarshal does not zero v first: fields absent
// from data keep their values (as with encoding/json), and a []byte field with capacity is
// decoded into in place; decode into a fresh or zeroed value. The decoded value never
// aliases data (msgpack copies strings and bytes out), so it may be kept after data's
// memory is reused. A panic in the decoder (a type's UnmarshalMsgpack included) is
// returned as an ErrInvalidData error rather than taking the process down.
type Msgpack struct {
	// ArrayStructs encodes structs as arrays of their field values in declaration order
	// instead of maps keyed by field name: smaller and faster to encode and decode, but
	// positional, so both sides must have the same fields in the same order (decoding an
	// array of another length into a struct fails). Either form decodes with any Msgpack.
	// A single struct type can opt in on its own with a field named _msgpack tagged
	// msgpack:",as_array" (_msgpack struct{} with that tag).
	//
	// msgpack v5.4.1 allocates a small error value (which it then discards) for every
	// array-encoded struct it decodes, so decoding this form costs one allocation per struct
	// more than the map form, though less time.
	ArrayStructs bool
}

var _ Codec = Msgpack{}

// Name returns "msgpack", with or without ArrayStructs: both decode alike.
func (Msgpack) Name() string { return "msgpack" }

// Append appends the MessagePack encoding of v to dst (see Codec.Append). Pass pointers
// to structs rather than struct values to save the allocation of boxing them in an any.
func (m Msgpack) Append(dst []byte, v any) ([]byte, error) { return m.AppendLimit(dst, v, 0) }

// AppendLimit is Append that stops with ErrTooLarge as soon as the output would pass limit
// bytes (len(dst) included); 0 means no limit. A large []byte or string is refused before
// it is copied: msgpack writes it in one piece after its length.
func (m Msgpack) AppendLimit(dst []byte, v any, limit int) ([]byte, error) {
	s := getEncoder(m.ArrayStructs)
	s.w.b, s.w.limit = dst, limit
	err := s.enc.Encode(v)
	out := s.w.b
	s.w.b = nil // keep no reference to the caller's memory in the pool
	encoderPools[b2i(m.ArrayStructs)].Put(s)
	if errors.Is(err, ErrTooLarge) {
		return dst, fmt.Errorf("codec: msgpack: encoding %T: %w: over %d bytes", v, ErrTooLarge, limit)
	}
	if err != nil {
		return dst, fmt.Errorf("codec: msgpack: encoding %T: %w", v, classify(err, nil))
	}
	return out, nil
}

// Unmarshal decodes the MessagePack value in data into v, which must be a non-nil pointer.
// The result does not alias data. See Msgpack for what is checked.
func (Msgpack) Unmarshal(data []byte, v any) error {
	if rv := reflect.ValueOf(v); rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("codec: msgpack: cannot decode into %s: %w (want a non-nil pointer)", typeName(v), ErrUnsupportedType)
	}
	if err := checkMsgpack(data); err != nil {
		return fmt.Errorf("codec: msgpack: decoding %d bytes into %T: %w: %w", len(data), v, ErrInvalidData, err)
	}
	s := getDecoder()
	s.r.Reset(data)
	panicked, err := s.decode(v)
	s.r.Reset(nil) // keep no reference to the transport's memory in the pool
	// The decoder keeps a scratch buffer as large as the longest string it has read (or
	// skipped); drop the decoders that read large payloads instead of pooling that memory.
	if !panicked && len(data) <= maxPooledInput {
		decoderPool.Put(s)
	}
	if err != nil {
		return fmt.Errorf("codec: msgpack: decoding %d bytes into %T: %w", len(data), v, classify(err, ErrInvalidData))
	}
	return nil
}

const (
	// maxDepth is how deeply arrays and maps may nest in data given to Unmarshal.
	maxDepth = 1000
	// maxPooledInput is the largest input after which a decoder goes back to the pool.
	maxPooledInput = 64 << 10
)

// sliceWriter is the msgpack encoder's output: it appends to a caller's slice. It
// implements io.ByteWriter so that msgpack writes single bytes without a temporary slice.
type sliceWriter struct {
	b     []byte
	limit int // the longest b may grow to; 0: no limit
}

func (w *sliceWriter) Write(p []byte) (int, error) {
	if w.limit > 0 && len(w.b)+len(p) > w.limit {
		return 0, ErrTooLarge
	}
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *sliceWriter) WriteByte(c byte) error {
	if w.limit > 0 && len(w.b) >= w.limit {
		return ErrTooLarge
	}
	w.b = append(w.b, c)
	return nil
}

type encoderState struct {
	enc *msgpack.Encoder
	w   sliceWriter
}

// encoderPools holds encoders set up for map-encoded (0) and array-encoded (1) structs.
// An encoder keeps its options across uses: only its writer's slice changes.
var encoderPools [2]sync.Pool

func getEncoder(arrayStructs bool) *encoderState {
	if s, ok := encoderPools[b2i(arrayStructs)].Get().(*encoderState); ok {
		return s
	}
	s := new(encoderState)
	s.enc = msgpack.NewEncoder(&s.w)
	s.enc.UseArrayEncodedStructs(arrayStructs)
	return s
}

type decoderState struct {
	dec *msgpack.Decoder
	// r is the view msgpack reads from: a bytes.Reader is an io.ByteScanner, so the decoder
	// reads data in place instead of through a bufio.Reader of its own.
	r bytes.Reader
}

var decoderPool sync.Pool

func getDecoder() *decoderState {
	if s, ok := decoderPool.Get().(*decoderState); ok {
		return s
	}
	s := new(decoderState)
	s.dec = msgpack.NewDecoder(&s.r)
	return s
}

// decode runs the msgpack decoder. A panic inside it (which well-formed input checked by
// checkMsgpack is not known to cause) is turned into an error, and the decoder, whose
// state is then unknown, must not be pooled.
func (s *decoderState) decode(v any) (panicked bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked, err = true, fmt.Errorf("msgpack decoder panicked: %v", p)
		}
	}()
	return false, s.dec.Decode(v)
}

// classify adds ErrUnsupportedType to msgpack's errors about types it cannot handle, and
// otherwise def (when not nil).
func classify(err, def error) error {
	if msg := err.Error(); strings.HasPrefix(msg, "msgpack: Encode(unsupported ") ||
		strings.HasPrefix(msg, "msgpack: Decode(unsupported ") ||
		strings.HasPrefix(msg, "msgpack: unsupported map key") {
		return fmt.Errorf("%w: %w", ErrUnsupportedType, err)
	}
	if def != nil && !errors.Is(err, def) {
		return fmt.Errorf("%w: %w", def, err)
	}
	return err
}

// typeName names v's type for an error message, saying when v is nil.
func typeName(v any) string {
	if v == nil {
		return "nil"
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
		return fmt.Sprintf("nil %T", v)
	}
	return fmt.Sprintf("%T", v)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
