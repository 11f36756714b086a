package rpc

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	md := MD{"a": {"1", "2"}, "trace-id": {"abc"}}
	b := appendRequest(nil, "/kv.KV/Get", 123456789, md)
	b = append(b, "body"...)
	var r request
	if err := parseRequest(b, &r); err != nil {
		t.Fatal(err)
	}
	if string(r.method) != "/kv.KV/Get" || r.deadline != 123456789 || string(r.body) != "body" || !reflect.DeepEqual(decodeMD(r.md, r.nmd), md) {
		t.Fatalf("got %q %d %q %v", r.method, r.deadline, r.body, decodeMD(r.md, r.nmd))
	}
	b = appendResponse(nil, nil, MD{"x": {"y"}}, "not found")
	b = append(b, "zz"...)
	var p response
	if err := parseResponse(b, &p); err != nil {
		t.Fatal(err)
	}
	if string(p.msg) != "not found" || string(p.body) != "zz" || decodeMD(p.md, p.nmd)["x"][0] != "y" {
		t.Fatalf("got %+v", p)
	}
}

func TestEnvelopeRejects(t *testing.T) {
	good := append(appendRequest(nil, "/s/m", 0, MD{"k": {"v"}}), "body"...)
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, b := range map[string][]byte{
		"short":            good[:10],
		"version":          mut(func(b []byte) []byte { b[0] = 2; return b }),
		"flags":            mut(func(b []byte) []byte { b[1] = 1; return b }),
		"empty method":     mut(func(b []byte) []byte { b[2], b[3] = 0, 0; return b }),
		"method too long":  mut(func(b []byte) []byte { b[3] = 0xff; return b }),
		"md count too big": mut(func(b []byte) []byte { b[5] = 0xff; return b }),
		"md truncated":     good[:reqFixed+4+3],
		"md value past end": mut(func(b []byte) []byte {
			b[reqFixed+4+2+1] = 0xff // value length of the first entry
			return b
		}),
	} {
		var r request
		if err := parseRequest(b, &r); !errors.Is(err, errEnvelope) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	var p response
	if err := parseResponse([]byte{1, 0, 0, 0, 0xff, 0, 0, 0}, &p); !errors.Is(err, errEnvelope) {
		t.Errorf("message past end: err = %v", err)
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(append(appendRequest(nil, "/kv.KV/Get", 99, MD{"a": {"b", "c"}}), 1, 2, 3))
	f.Add(appendRequest(nil, "/x/y", 0, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r request
		if err := parseRequest(b, &r); err != nil {
			return
		}
		md := decodeMD(r.md, r.nmd)
		// What parses re-encodes to an envelope that parses the same way.
		again := append(appendRequest(nil, string(r.method), r.deadline, md), r.body...)
		var r2 request
		if err := parseRequest(again, &r2); err != nil || !bytes.Equal(r2.method, r.method) || r2.deadline != r.deadline || !bytes.Equal(r2.body, r.body) {
			t.Fatalf("re-encoded envelope differs: %v", err)
		}
	})
}

func FuzzParseResponse(f *testing.F) {
	f.Add(append(appendResponse(nil, nil, MD{"k": {"v"}}, "msg"), 9))
	f.Add(append(appendResponse(nil, MD{"h": {"1", "2"}}, MD{"k": {"v"}}, "msg"), 9))
	d, _ := encodeDetails([]any{&RetryInfo{RetryDelay: 1}, &RawDetail{Type: "x", Value: []byte{1}}})
	f.Add(append(appendResponseDetails(nil, MD{"h": {"1"}}, nil, "msg", d), 9))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r response
		if err := parseResponse(b, &r); err != nil {
			return
		}
		_ = decodeMD(r.md, r.nmd)
		_ = decodeMD(r.hdr, r.nhdr)
	})
}

// FuzzParseHeaderMsg: a stream's header message is bytes from a peer.
func FuzzParseHeaderMsg(f *testing.F) {
	f.Add(appendHeaderMD(nil, MD{"k": {"v", "w"}, "x": {""}}))
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		md, err := parseHeaderMsg(b)
		if err != nil {
			return
		}
		again, err := parseHeaderMsg(appendHeaderMD(nil, md))
		if err != nil || len(again) != len(md) {
			t.Fatalf("re-encoded header differs: %v %v", again, err)
		}
	})
}

// TestEnvelopeHugeLengths: lengths of 2^32-1 are refused (on 32-bit platforms they used
// to turn negative and slip past the checks).
func TestEnvelopeHugeLengths(t *testing.T) {
	var p response
	if err := parseResponse([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, &p); !errors.Is(err, errEnvelope) {
		t.Errorf("message length 2^32-1: %v", err)
	}
	b := appendResponse(nil, nil, MD{"k": {"v"}}, "")
	b[respFixed+2+1+0], b[respFixed+2+1+1], b[respFixed+2+1+2], b[respFixed+2+1+3] = 0xff, 0xff, 0xff, 0xff
	if err := parseResponse(b, &p); !errors.Is(err, errEnvelope) {
		t.Errorf("metadata value length 2^32-1: %v", err)
	}
}

// FuzzDecodeDetails: a status's details are bytes from a peer; what decodes re-encodes.
func FuzzDecodeDetails(f *testing.F) {
	d, _ := encodeDetails([]any{&RetryInfo{RetryDelay: 5}, &BadRequest{FieldViolations: []FieldViolation{{"a", "b"}}},
		&ErrorInfo{Reason: "R", Metadata: map[string]string{"k": "v"}}, &RawDetail{Type: "t", Value: []byte{0xc0}}})
	f.Add(d)
	f.Add([]byte{0x91, 0x82})
	f.Fuzz(func(t *testing.T, b []byte) {
		ds, err := decodeDetails(b)
		if err != nil {
			return
		}
		if _, err := encodeDetails(ds); err != nil && len(ds) <= maxDetails && len(b) <= maxDetailBytes/2 {
			t.Fatalf("decoded details do not re-encode: %v", err)
		}
	})
}
