package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/reflection"
)

// testSchema is the schema of the in-process echo service (every kind of field).
func testSchema() (schema, reflection.Type) {
	d := reflection.Describe(rpc.ServiceInfo{Desc: &echoDesc, Codec: codec.Msgpack{}})
	return schema{d}, d.Methods[0].Request
}

// FuzzDecode: a response is bytes from a peer; decoding it to JSON never panics and,
// when it succeeds, gives valid JSON.
func FuzzDecode(f *testing.F) {
	s, typ := testSchema()
	for _, v := range []any{
		&allKinds{B: true, I: -3, S: "x", Bytes: []byte{1}, When: time.Unix(1, 2), Inner: &inner{N: 1, Tags: []string{"a"}},
			List: []inner{{N: 2}}, ByID: map[int]string{1: "a"}, Any: map[string]any{"k": []any{1, "v"}}},
		&allKinds{},
		map[string]any{"Inner": []any{1, []any{"t"}}}, // a struct as an array
		[]any{nil, 1.5, float32(2)},
	} {
		b, err := codec.Msgpack{}.Append(nil, v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
	}
	f.Add([]byte{0xc1}, false)
	f.Add([]byte("raw bytes"), true)
	f.Fuzz(func(t *testing.T, data []byte, raw bool) {
		j, err := s.decode(typ, raw, data)
		if err == nil && !json.Valid(j) {
			t.Fatalf("decode(%x) = %s: not JSON", data, j)
		}
	})
}

// TestEncodeDecodeRoundTrip: JSON encoded through the schema decodes into the Go type
// with the values written, and decodes back to the same JSON.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	s, typ := testSchema()
	in := `{"B":true,"I":-1,"Small":-128,"U":4294967295,"F":0.25,"S":"s","Bytes":"/w==","When":"2026-01-02T03:04:05Z",` +
		`"Inner":{"N":255,"Tags":["x"]},"List":[],"ByID":{"7":"seven"},"renamed_field":"r","Any":null,"MD":""}`
	b, err := s.encode(typ, false, json.RawMessage(in))
	if err != nil {
		t.Fatal(err)
	}
	var got allKinds
	if err := (codec.Msgpack{}).Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !got.B || got.I != -1 || got.Small != -128 || got.U != 4294967295 || got.F != 0.25 || got.Bytes[0] != 0xff ||
		!got.When.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) || got.Inner.N != 255 || got.ByID[7] != "seven" || got.Renamed != "r" {
		t.Errorf("decoded %+v", got)
	}
	out, err := s.decode(typ, false, b)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != in {
		t.Errorf("round trip:\n%s\nwant\n%s", out, in)
	}
}
