package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/rpc/reflection"
)

// schema converts messages between JSON and their encoding on the wire, guided by a
// service's reflected types.
type schema struct {
	svc *reflection.ServiceDescriptor
}

// encode turns one JSON value into the bytes of a message of type t: the value's bytes
// themselves when raw (t is bytes), else its msgpack encoding.
func (s schema) encode(t reflection.Type, raw bool, js json.RawMessage) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(js))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("reading JSON: %w", err)
	}
	val, err := s.fromJSON(t, v, "")
	if err != nil {
		return nil, err
	}
	if raw {
		b, ok := val.([]byte)
		if !ok {
			return nil, fmt.Errorf("a raw message is a base64 string, not %s", jsonKind(v))
		}
		return b, nil
	}
	return codec.Msgpack{}.Append(nil, val)
}

// decode turns the bytes of a message of type t into JSON (compact).
func (s schema) decode(t reflection.Type, raw bool, data []byte) ([]byte, error) {
	var v any
	if raw {
		v = data
	} else {
		// The codec checks that data is well formed (lengths, depth) before it is decoded.
		if err := (codec.Msgpack{}).Unmarshal(data, new(msgpack.RawMessage)); err != nil {
			return nil, err
		}
		d := msgpack.NewDecoder(bytes.NewReader(data))
		d.SetMapDecoder(decodeMap)
		var err error
		if v, err = d.DecodeInterface(); err != nil {
			return nil, fmt.Errorf("decoding msgpack: %w", err)
		}
	}
	var b bytes.Buffer
	if err := s.toJSON(&b, t, v, 0); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// decodeMap decodes a msgpack map of any keys (a peer may send a list as a key, which no
// Go map takes) into a map keyed by each key's text.
func decodeMap(d *msgpack.Decoder) (any, error) {
	n, err := d.DecodeMapLen()
	if err != nil || n < 0 {
		return nil, err
	}
	m := make(map[any]any, min(n, 1024))
	for range n {
		k, err := d.DecodeInterface()
		if err != nil {
			return nil, err
		}
		if m[keyText(k)], err = d.DecodeInterface(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// keyText is a map key as a JSON object's key.
func keyText(k any) string {
	switch k := k.(type) {
	case string:
		return k
	case []byte:
		return string(k)
	}
	return fmt.Sprint(k)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

// at names a place in a message, for errors: "the request" or "field Items[2].Key".
func at(path string) string {
	if path == "" {
		return "the message"
	}
	return path
}

// fromJSON converts v, as encoding/json decoded it (with UseNumber), into a value whose
// msgpack encoding decodes into type t.
func (s schema) fromJSON(t reflection.Type, v any, path string) (any, error) {
	if v == nil {
		return nil, nil // msgpack's nil: the zero value, or a nil pointer
	}
	mismatch := func(want string) error {
		return fmt.Errorf("%s: want %s for %s, got %s", at(path), want, t.Go, jsonKind(v))
	}
	switch t.Kind {
	case reflection.KindBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
		return nil, mismatch("a boolean")
	case reflection.KindInt, reflection.KindUint, reflection.KindFloat:
		n, ok := v.(json.Number)
		if !ok {
			return nil, mismatch("a number")
		}
		return number(t, n, path)
	case reflection.KindString:
		if str, ok := v.(string); ok {
			return str, nil
		}
		return nil, mismatch("a string")
	case reflection.KindBytes:
		str, ok := v.(string)
		if !ok {
			return nil, mismatch("a base64 string")
		}
		b, err := base64.StdEncoding.DecodeString(str)
		if err != nil {
			return nil, fmt.Errorf("%s: %s is base64: %w", at(path), t.Go, err)
		}
		return b, nil
	case reflection.KindTime:
		str, ok := v.(string)
		if !ok {
			return nil, mismatch("an RFC 3339 time")
		}
		tm, err := time.Parse(time.RFC3339Nano, str)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", at(path), err)
		}
		return tm, nil
	case reflection.KindList:
		return s.listFromJSON(t, v, path)
	case reflection.KindMap:
		return s.mapFromJSON(t, v, path)
	case reflection.KindStruct:
		return s.structFromJSON(t, v, path)
	}
	return anyFromJSON(v), nil
}

// number parses n as the number t is, in range.
func number(t reflection.Type, n json.Number, path string) (any, error) {
	bits := t.Bits
	if bits == 0 {
		bits = 64
	}
	var v any
	var err error
	switch t.Kind {
	case reflection.KindInt:
		v, err = strconv.ParseInt(string(n), 10, bits)
	case reflection.KindUint:
		v, err = strconv.ParseUint(string(n), 10, bits)
	default:
		var f float64
		f, err = strconv.ParseFloat(string(n), bits)
		v = f
		if bits == 32 {
			v = float32(f)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %s is not a %s: %w", at(path), n, t.Go, errors.Unwrap(err))
	}
	return v, nil
}

func (s schema) listFromJSON(t reflection.Type, v any, path string) (any, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s: want an array for %s, got %s", at(path), t.Go, jsonKind(v))
	}
	out := make([]any, len(arr))
	for i, e := range arr {
		var err error
		if out[i], err = s.fromJSON(*t.Elem, e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s schema) mapFromJSON(t reflection.Type, v any, path string) (any, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want an object for %s, got %s", at(path), t.Go, jsonKind(v))
	}
	out := make(map[any]any, len(obj))
	for k, e := range obj {
		key, err := mapKey(*t.Key, k)
		if err != nil {
			return nil, fmt.Errorf("%s: key %q: %w", at(path), k, err)
		}
		if out[key], err = s.fromJSON(*t.Elem, e, fmt.Sprintf("%s[%q]", path, k)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// mapKey converts a JSON object's key to a map key of type t.
func mapKey(t reflection.Type, k string) (any, error) {
	switch t.Kind {
	case reflection.KindString:
		return k, nil
	case reflection.KindInt, reflection.KindUint, reflection.KindFloat:
		return number(t, json.Number(k), "")
	case reflection.KindBool:
		return strconv.ParseBool(k)
	}
	return nil, fmt.Errorf("keys of type %s cannot be written in JSON", t.Go)
}

func (s schema) structFromJSON(t reflection.Type, v any, path string) (any, error) {
	st := s.svc.Struct(t.Struct)
	if st == nil {
		return nil, fmt.Errorf("%s: the server described no struct %s", at(path), t.Struct)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: want an object for %s, got %s", at(path), t.Go, jsonKind(v))
	}
	out := make(map[string]any, len(obj))
	for k, e := range obj {
		i := slices.IndexFunc(st.Fields, func(f reflection.FieldDescriptor) bool { return f.Name == k })
		if i < 0 {
			return nil, fmt.Errorf("%s: %s has no field %q (its fields: %s)", at(path), st.Name, k, fieldNames(st))
		}
		fp := k
		if path != "" {
			fp = path + "." + k
		}
		val, err := s.fromJSON(st.Fields[i].Type, e, fp)
		if err != nil {
			return nil, err
		}
		out[k] = val
	}
	return out, nil // a map decodes into the struct whichever form the server's codec writes
}

func fieldNames(st *reflection.StructDescriptor) string {
	names := make([]string, len(st.Fields))
	for i, f := range st.Fields {
		names[i] = f.Name
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// anyFromJSON converts JSON numbers of an interface-typed value to int64 or float64.
func anyFromJSON(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case []any:
		for i := range v {
			v[i] = anyFromJSON(v[i])
		}
	case map[string]any:
		for k := range v {
			v[k] = anyFromJSON(v[k])
		}
	}
	return v
}

// maxDepth bounds the nesting toJSON follows; the codec's check bounds it too.
const maxDepth = 1000

// toJSON writes v, as msgpack decoded it without a type, as JSON shaped by t: a struct's
// fields in declaration order (those a newer server added after them, sorted), bytes in
// base64, times in RFC 3339.
func (s schema) toJSON(b *bytes.Buffer, t reflection.Type, v any, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("message nested over %d deep", maxDepth)
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
		return nil
	case []byte:
		if t.Kind == reflection.KindString {
			return writeJSON(b, string(v))
		}
		return writeJSON(b, v)
	case []any:
		if t.Kind == reflection.KindStruct {
			return s.arrayStructToJSON(b, t, v, depth)
		}
		elem := reflection.Type{Kind: reflection.KindAny}
		if t.Kind == reflection.KindList && t.Elem != nil {
			elem = *t.Elem
		}
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := s.toJSON(b, elem, e, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
		return nil
	case map[any]any:
		return s.mapToJSON(b, t, v, depth)
	case float32:
		return writeFloat(b, float64(v))
	case float64:
		return writeFloat(b, v)
	}
	return writeJSON(b, v)
}

func writeJSON(b *bytes.Buffer, v any) error {
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b.Write(j)
	return nil
}

// writeFloat writes what JSON cannot hold (NaN, infinities) as a string.
func writeFloat(b *bytes.Buffer, f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return writeJSON(b, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return writeJSON(b, f)
}

// mapToJSON writes a map: a struct's fields in order, or a map's entries sorted by key.
func (s schema) mapToJSON(b *bytes.Buffer, t reflection.Type, m map[any]any, depth int) error {
	keys := make([]string, 0, len(m))
	byKey := make(map[string]any, len(m))
	for k, v := range m {
		ks := keyText(k)
		keys = append(keys, ks)
		byKey[ks] = v
	}
	slices.Sort(keys)
	typeOf := func(string) reflection.Type { return reflection.Type{Kind: reflection.KindAny} }
	if t.Kind == reflection.KindMap && t.Elem != nil {
		typeOf = func(string) reflection.Type { return *t.Elem }
	}
	if st := s.svc.Struct(t.Struct); t.Kind == reflection.KindStruct && st != nil {
		var ordered []string
		for _, f := range st.Fields {
			if _, ok := byKey[f.Name]; ok {
				ordered = append(ordered, f.Name)
			}
		}
		for _, k := range keys {
			if !slices.Contains(ordered, k) {
				ordered = append(ordered, k) // a field this descriptor does not know
			}
		}
		keys = ordered
		typeOf = func(k string) reflection.Type {
			for _, f := range st.Fields {
				if f.Name == k {
					return f.Type
				}
			}
			return reflection.Type{Kind: reflection.KindAny}
		}
	}
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := writeJSON(b, k); err != nil {
			return err
		}
		b.WriteByte(':')
		if err := s.toJSON(b, typeOf(k), byKey[k], depth+1); err != nil {
			return err
		}
	}
	b.WriteByte('}')
	return nil
}

// arrayStructToJSON writes a struct that travelled as an array of its fields.
func (s schema) arrayStructToJSON(b *bytes.Buffer, t reflection.Type, v []any, depth int) error {
	st := s.svc.Struct(t.Struct)
	m := make(map[any]any, len(v))
	for i, e := range v {
		name := strconv.Itoa(i)
		if st != nil && i < len(st.Fields) {
			name = st.Fields[i].Name
		}
		m[name] = e
	}
	return s.mapToJSON(b, t, m, depth)
}

// jsonValues reads the JSON values of r, one after another (JSON lines, or values
// separated by any white space), calling f with each.
func jsonValues(r io.Reader, f func(json.RawMessage) error) error {
	d := json.NewDecoder(r)
	for {
		var raw json.RawMessage
		if err := d.Decode(&raw); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading JSON input: %w", err)
		}
		if err := f(raw); err != nil {
			return err
		}
	}
}
