package reflection

import (
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/rpc"
)

// ServiceDescriptor describes a service: its methods and the struct types they use.
type ServiceDescriptor struct {
	Name    string // the full name, "kvservice.KV"
	Methods []MethodDescriptor
	// Structs are the struct types the methods' messages use, each once, by name.
	Structs []StructDescriptor
}

// MethodDescriptor describes one method.
type MethodDescriptor struct {
	Name string // "Get": called as "/<service>/<Name>"
	// ClientStreams and ServerStreams say who sends a stream of messages: neither is
	// a unary method.
	ClientStreams, ServerStreams bool
	// Request and Response are the types of the request (of each message the caller
	// streams) and of the response (of each message the server streams).
	Request, Response Type
	// Codec names what encodes the messages ("msgpack", "raw"): a codec.Codec's Name.
	Codec string
	// RawRequest and RawResponse say that the message travels as its bytes, not
	// encoded: a []byte message of a stream, or both of a method on the raw codec.
	RawRequest, RawResponse bool
}

// Kind is what a Type is, as the msgpack codec carries it.
type Kind string

// The kinds.
const (
	KindBool   Kind = "bool"
	KindInt    Kind = "int"   // signed; Bits says its width
	KindUint   Kind = "uint"  // unsigned; Bits says its width
	KindFloat  Kind = "float" // Bits: 32 or 64
	KindString Kind = "string"
	KindBytes  Kind = "bytes"  // []byte, a byte array, or an encoding.BinaryMarshaler
	KindTime   Kind = "time"   // time.Time
	KindList   Kind = "list"   // a slice or array of Elem
	KindMap    Kind = "map"    // Key to Elem
	KindStruct Kind = "struct" // the struct Struct names (ServiceDescriptor.Structs)
	KindAny    Kind = "any"    // an interface, or a type with its own msgpack encoding
)

// Type describes the type of a message or a field.
type Type struct {
	Kind Kind
	Go   string // the Go spelling, "*kvservice.GetRequest", "[]string", "int64"
	Bits int    `msgpack:",omitempty"` // of an int, uint or float
	// Nullable: the value may be nil (a pointer, slice, map or interface).
	Nullable bool   `msgpack:",omitempty"`
	Struct   string `msgpack:",omitempty"` // a struct's name in ServiceDescriptor.Structs
	Elem     *Type  `msgpack:",omitempty"` // a list's element, a map's value
	Key      *Type  `msgpack:",omitempty"` // a map's key
}

// StructDescriptor describes a struct type: its fields as they travel.
type StructDescriptor struct {
	Name    string // the Go name with its package, "kvservice.GetRequest"
	Fields  []FieldDescriptor
	AsArray bool `msgpack:",omitempty"` // travels as an array of the fields, in order
}

// FieldDescriptor is one field of a struct, under its name on the wire.
type FieldDescriptor struct {
	Name      string // the key it travels under (the Go name unless a msgpack tag renames it)
	Type      Type
	OmitEmpty bool `msgpack:",omitempty"`
}

// Describe describes the registered service si, from its interface type: each method's
// stream kind and message types, and every struct type they reach. A method whose
// interface is not known (a ServiceDesc without HandlerType) gets KindAny messages.
func Describe(si rpc.ServiceInfo) *ServiceDescriptor {
	sd := si.Desc
	b := &builder{seen: map[reflect.Type]string{}}
	var iface reflect.Type
	if sd.HandlerType != nil {
		iface = reflect.TypeOf(sd.HandlerType).Elem()
	}
	d := &ServiceDescriptor{Name: sd.ServiceName}
	for _, m := range sd.Methods {
		md := MethodDescriptor{Name: m.MethodName, Codec: codecName(m.Codec, si.Codec)}
		md.Request, md.Response = b.signature(iface, m.MethodName)
		md.RawRequest = md.Codec == (codec.Raw{}).Name()
		md.RawResponse = md.RawRequest
		d.Methods = append(d.Methods, md)
	}
	for _, s := range sd.Streams {
		md := MethodDescriptor{Name: s.StreamName, ClientStreams: s.ClientStreams, ServerStreams: s.ServerStreams,
			Codec: codecName(s.Codec, si.Codec)}
		md.Request, md.Response = b.signature(iface, s.StreamName)
		md.RawRequest = md.Request.Go == "[]byte" // as sent: never encoded
		md.RawResponse = md.Response.Go == "[]byte"
		d.Methods = append(d.Methods, md)
	}
	slices.SortFunc(d.Methods, func(a, b MethodDescriptor) int { return strings.Compare(a.Name, b.Name) })
	d.Structs = b.structs
	slices.SortFunc(d.Structs, func(a, b StructDescriptor) int { return strings.Compare(a.Name, b.Name) })
	return d
}

func codecName(c, def codec.Codec) string {
	if c == nil {
		c = def
	}
	if c == nil {
		return (codec.Msgpack{}).Name()
	}
	return c.Name()
}

// builder collects the struct types a service's messages reach.
type builder struct {
	seen    map[reflect.Type]string
	structs []StructDescriptor
}

var (
	errorType = reflect.TypeFor[error]()
)

// signature returns the request and response types of method name of iface: each
// message's type for a stream (the T of iter.Seq2[T, error]).
func (b *builder) signature(iface reflect.Type, name string) (req, resp Type) {
	anyType := Type{Kind: KindAny, Go: "any", Nullable: true}
	if iface == nil {
		return anyType, anyType
	}
	m, ok := iface.MethodByName(name)
	if !ok || m.Type.NumIn() != 2 || m.Type.NumOut() < 1 {
		return anyType, anyType
	}
	return b.typeOf(seqElem(m.Type.In(1))), b.typeOf(seqElem(m.Type.Out(0)))
}

// seqElem returns T for iter.Seq2[T, error] (a func(yield func(T, error) bool)), else t.
func seqElem(t reflect.Type) reflect.Type {
	if t.Kind() != reflect.Func || t.NumIn() != 1 || t.NumOut() != 0 {
		return t
	}
	y := t.In(0)
	if y.Kind() != reflect.Func || y.NumIn() != 2 || y.In(1) != errorType || y.NumOut() != 1 || y.Out(0).Kind() != reflect.Bool {
		return t
	}
	return y.In(0)
}

var (
	timeType           = reflect.TypeFor[time.Time]()
	customEncoderType  = reflect.TypeFor[msgpack.CustomEncoder]()
	marshalerType      = reflect.TypeFor[msgpack.Marshaler]()
	binaryMarshalerTyp = reflect.TypeFor[encoding.BinaryMarshaler]()
	textMarshalerType  = reflect.TypeFor[encoding.TextMarshaler]()
)

// typeOf describes t as the msgpack codec carries it.
func (b *builder) typeOf(t reflect.Type) Type {
	out := Type{Go: strings.ReplaceAll(t.String(), "[]uint8", "[]byte")} // the same type, as Go code writes it
	nullable := false
	for t.Kind() == reflect.Pointer {
		t, nullable = t.Elem(), true
	}
	out.Nullable = nullable
	if own := ownEncoding(t); own != "" {
		out.Kind = own
		return out
	}
	switch t.Kind() {
	case reflect.Bool:
		out.Kind = KindBool
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		out.Kind, out.Bits = KindInt, t.Bits()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		out.Kind, out.Bits = KindUint, t.Bits()
	case reflect.Float32, reflect.Float64:
		out.Kind, out.Bits = KindFloat, t.Bits()
	case reflect.String:
		out.Kind = KindString
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			out.Kind, out.Nullable = KindBytes, nullable || t.Kind() == reflect.Slice
			return out
		}
		elem := b.typeOf(t.Elem())
		out.Kind, out.Elem, out.Nullable = KindList, &elem, nullable || t.Kind() == reflect.Slice
	case reflect.Map:
		key, elem := b.typeOf(t.Key()), b.typeOf(t.Elem())
		out.Kind, out.Key, out.Elem, out.Nullable = KindMap, &key, &elem, true
	case reflect.Struct:
		out.Kind, out.Struct = KindStruct, b.structOf(t)
	default: // interfaces; the generator refuses channels, functions and the like
		out.Kind, out.Nullable = KindAny, true
	}
	return out
}

// ownEncoding returns the kind of a type that msgpack encodes its own way, or "".
func ownEncoding(t reflect.Type) Kind {
	pt := reflect.PointerTo(t)
	switch {
	case t == timeType:
		return KindTime
	case pt.Implements(customEncoderType), pt.Implements(marshalerType):
		return KindAny
	case pt.Implements(binaryMarshalerTyp):
		return KindBytes
	case pt.Implements(textMarshalerType):
		return KindString
	}
	return ""
}

// structOf describes struct t once and returns its name.
func (b *builder) structOf(t reflect.Type) string {
	if name, ok := b.seen[t]; ok {
		return name
	}
	name := t.String()
	b.seen[t] = name
	i := len(b.structs)
	b.structs = append(b.structs, StructDescriptor{Name: name})
	sd := StructDescriptor{Name: name}
	b.fields(t, &sd, map[string]bool{}, false)
	b.structs[i] = sd
	return name
}

// fields appends the fields of struct t as msgpack's struct encoder finds them: exported
// fields under their tag's name, embedded structs inlined, "-" left out.
func (b *builder) fields(t reflect.Type, sd *StructDescriptor, have map[string]bool, inlined bool) {
	omitAll := false
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		hasOpt := func(o string) bool { return slices.Contains(strings.Split(opts, ","), o) }
		if name == "-" {
			continue
		}
		if f.Name == "_msgpack" {
			sd.AsArray = sd.AsArray || (!inlined && (hasOpt("as_array") || hasOpt("asArray")))
			omitAll = hasOpt("omitempty")
			continue
		}
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		if f.Anonymous && name == "" && !hasOpt("noinline") {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct && ownEncoding(et) == "" {
				b.fields(et, sd, have, true)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if have[name] {
			continue // the outer field of that name wins
		}
		have[name] = true
		sd.Fields = append(sd.Fields, FieldDescriptor{Name: name, Type: b.typeOf(f.Type), OmitEmpty: omitAll || hasOpt("omitempty")})
	}
}

// String renders t as its Go spelling and kind, for people.
func (t Type) String() string {
	if t.Go == "" {
		return string(t.Kind)
	}
	return fmt.Sprintf("%s (%s)", t.Go, t.Kind)
}
