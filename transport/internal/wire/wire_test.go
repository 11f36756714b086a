package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func seedHeaders() []struct {
	h       Header
	payload []byte
} {
	return []struct {
		h       Header
		payload []byte
	}{
		{Header{Kind: KindRequest, Credits: 3, CallID: 1, Len: 5}, []byte("hello")},
		{Header{Kind: KindResponse, Status: 13, CallID: 1 << 40, Len: 0}, nil},
		{Header{Kind: KindResponse, Flags: FlagLarge, CallID: 7, Len: 1 << 20, RKey: 0x1234ff, Addr: 0x7f0012345000}, nil},
		{Header{Kind: KindRequest, Flags: FlagLarge, CallID: 8, Len: 64 << 20, RKey: 0x100, Addr: 0x1000}, nil},
		{Header{Kind: KindRequest, Flags: FlagLarge | FlagWritable, CallID: 8, Len: 1 << 20, RKey: 0x200, Addr: 0x3000}, nil},
		{Header{Kind: KindResponse, Flags: FlagWritten, Status: 0, CallID: 8, Len: 1 << 20}, nil},
		{Header{Kind: KindRequest, Flags: FlagPushed | FlagWritable, CallID: 8, Len: 1 << 20, RKey: 0x300, Addr: 0x4000}, nil},
		{Header{Kind: KindGrant, Len: 1 << 20, RKey: 0x400, Addr: 0x5000}, nil},
		{Header{Kind: KindCancel, CallID: 9}, nil},
		{Header{Kind: KindRelease, Credits: 64}, nil},
		{Header{Kind: KindRelease, CtrlCredits: 16}, nil},
		{Header{Kind: KindPing, CallID: 10}, nil},
		{Header{Kind: KindGoAway, CallID: 11}, nil},
		{Header{Kind: KindRequest, Flags: FlagStream, Status: 4096, CallID: 12, Len: 2}, []byte("hi")},
		{Header{Kind: KindStreamMsg, Flags: FlagCaller, CallID: 12, Len: 3}, []byte("abc")},
		{Header{Kind: KindStreamMsg, Flags: FlagLarge, CallID: 12, Len: 1 << 20, RKey: 5, Addr: 0x2000}, nil},
		{Header{Kind: KindStreamMsg, Flags: FlagCaller | FlagEnd, CallID: 12}, nil},
		{Header{Kind: KindStreamMsg, CallID: 12, Len: 2, RKey: 4160}, []byte("ok")},
		{Header{Kind: KindStreamMsg, Flags: FlagCaller | FlagEnd, CallID: 12, RKey: 128}, nil},
		{Header{Kind: KindStreamAck, CallID: 12, Len: StreamAckLen}, make([]byte, StreamAckLen)},
		{Header{Kind: KindStreamAck, Status: 1, CallID: 12, Len: StreamAckLen}, make([]byte, StreamAckLen)},
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, s := range seedHeaders() {
		b := append(AppendHeader(nil, &s.h), s.payload...)
		var h Header
		p, err := ParseHeader(b, &h, 64<<20)
		if err != nil || h != s.h || !bytes.Equal(p, s.payload) {
			t.Fatalf("%v: got %+v %q %v, want %+v %q", s.h.Kind, h, p, err, s.h, s.payload)
		}
	}
}

func TestParseHeaderRejects(t *testing.T) {
	eager := AppendHeader(nil, &Header{Kind: KindRequest, CallID: 1, Len: 3})
	eager = append(eager, "abc"...)
	large := AppendHeader(nil, &Header{Kind: KindResponse, Flags: FlagLarge, Len: 100, RKey: 1, Addr: 2})
	pushed := AppendHeader(nil, &Header{Kind: KindRequest, Flags: FlagPushed | FlagWritable, Len: 100, RKey: 0x101, Addr: 0x202})
	grant := AppendHeader(nil, &Header{Kind: KindGrant, Len: 100, RKey: 0x101, Addr: 0x202})
	ack := append(AppendHeader(nil, &Header{Kind: KindStreamAck, Len: StreamAckLen}), make([]byte, StreamAckLen)...)
	mut := func(b []byte, f func(b []byte)) []byte { c := append([]byte(nil), b...); f(c); return c }
	for _, tc := range []struct {
		name string
		b    []byte
		too  bool
	}{
		{"short", eager[:HeaderLen-1], false},
		{"magic", mut(eager, func(b []byte) { b[0] = 0 }), false},
		{"kind zero", mut(eager, func(b []byte) { b[1] = 0 }), false},
		{"kind unknown", mut(eager, func(b []byte) { b[1] = byte(kindMax) }), false},
		{"flags", mut(eager, func(b []byte) { b[2] = 0x80 }), false},
		{"writable on an eager request", mut(eager, func(b []byte) { b[2] = byte(FlagWritable) }), false},
		{"writable on a response", mut(large, func(b []byte) { b[2] |= byte(FlagWritable) }), false},
		{"writable on a stream", mut(large, func(b []byte) { b[1], b[2] = byte(KindRequest), byte(FlagLarge|FlagStream|FlagWritable) }), false},
		{"written on a request", mut(large, func(b []byte) { b[1], b[2] = byte(KindRequest), byte(FlagWritten) }), false},
		{"written and large", mut(large, func(b []byte) { b[2] |= byte(FlagWritten) }), false},
		{"written with a window", mut(large, func(b []byte) { b[2] = byte(FlagWritten) }), false},
		{"written with eager bytes", append(mut(large, func(b []byte) { b[2], b[20], b[24] = byte(FlagWritten), 0, 0 }), 1), false},
		{"written of zero", mut(large, func(b []byte) { b[2], b[20], b[24], b[16] = byte(FlagWritten), 0, 0, 0 }), true},
		{"written too large", mut(large, func(b []byte) { b[2], b[20], b[24], b[19] = byte(FlagWritten), 0, 0, 0x10 }), true},
		{"pushed without writable", mut(pushed, func(b []byte) { b[2] = byte(FlagPushed) }), false},
		{"pushed and large", mut(pushed, func(b []byte) { b[2] |= byte(FlagLarge) }), false},
		{"pushed on a response", mut(pushed, func(b []byte) { b[1] = byte(KindResponse) }), false},
		{"pushed without a window", mut(pushed, func(b []byte) { b[20], b[21] = 0, 0 }), false},
		{"pushed with eager bytes", append(append([]byte(nil), pushed...), 1), false},
		{"pushed of zero", mut(pushed, func(b []byte) { b[16] = 0 }), true},
		{"pushed too large", mut(pushed, func(b []byte) { b[19] = 0x10 }), true},
		{"grant with flags", mut(grant, func(b []byte) { b[2] = byte(FlagLarge) }), false},
		{"grant without a window", mut(grant, func(b []byte) { b[24], b[25] = 0, 0 }), false},
		{"grant with eager bytes", append(append([]byte(nil), grant...), 1), false},
		{"grant of zero", mut(grant, func(b []byte) { b[16] = 0 }), true},
		{"grant too large", mut(grant, func(b []byte) { b[19] = 0x10 }), true},
		{"stream flag on a response", mut(large, func(b []byte) { b[2] |= byte(FlagStream) }), false},
		{"end on a request", mut(eager, func(b []byte) { b[2] = byte(FlagEnd) }), false},
		{"end with a payload", mut(eager, func(b []byte) { b[1], b[2] = byte(KindStreamMsg), byte(FlagEnd) }), false},
		{"caller on a request", mut(eager, func(b []byte) { b[2] = byte(FlagCaller) }), false},
		{"short stream ack", mut(eager, func(b []byte) { b[1] = byte(KindStreamAck) }), false},
		{"length mismatch", eager[:len(eager)-1], false},
		{"eager with window", mut(eager, func(b []byte) { b[20] = 1 }), false},
		{"eager stream message with an address", mut(eager, func(b []byte) { b[1], b[20], b[24] = byte(KindStreamMsg), 1, 1 }), false},
		{"stream ack with an rkey", mut(ack, func(b []byte) { b[20] = 1 }), false},
		{"large cancel", mut(large, func(b []byte) { b[1] = byte(KindCancel) }), false},
		{"large with eager bytes", append(append([]byte(nil), large...), 1), false},
		{"large of zero", mut(large, func(b []byte) { b[16] = 0 }), true},
		{"large too large", mut(large, func(b []byte) { b[19] = 0x10 }), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Header
			_, err := ParseHeader(tc.b, &h, 1<<20)
			if !errors.Is(err, ErrMalformed) || tc.too != errors.Is(err, ErrTooLarge) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestHello(t *testing.T) {
	good := Hello{Version: Version, SlotSize: 4096, Credits: 64, Inline: 4000, MaxMessage: 64 << 20}
	var h Hello
	rest, err := ParseHello(append(AppendHello(nil, &good), 1), &h)
	if err != nil || h != good || len(rest) != 1 {
		t.Fatalf("ParseHello = %+v %v", h, err)
	}
	for name, bad := range map[string]Hello{
		"version":     {Version: Version + 1, SlotSize: 4096, Credits: 64, Inline: 10, MaxMessage: 1},
		"slot":        {Version: Version, SlotSize: 8, Credits: 64, MaxMessage: 1},
		"credits":     {Version: Version, SlotSize: 4096, Credits: 1, MaxMessage: 1},
		"inline":      {Version: Version, SlotSize: 4096, Credits: 64, Inline: 4090, MaxMessage: 1},
		"max message": {Version: Version, SlotSize: 4096, Credits: 64},
	} {
		if _, err := ParseHello(AppendHello(nil, &bad), &h); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if _, err := ParseHello([]byte("GET / HTTP/1.1\r\nHost: example\r\n"), &h); !errors.Is(err, ErrMalformed) {
		t.Errorf("http: err = %v", err)
	}
}

func FuzzParseHeader(f *testing.F) {
	for _, s := range seedHeaders() {
		f.Add(append(AppendHeader(nil, &s.h), s.payload...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		p, err := ParseHeader(b, &h, 64<<20)
		if err != nil {
			return
		}
		if enc := append(AppendHeader(nil, &h), p...); !bytes.Equal(enc, b) {
			t.Fatalf("accepted %x, re-encodes to %x", b, enc)
		}
	})
}

func FuzzParseHello(f *testing.F) {
	f.Add(AppendHello(nil, &Hello{Version: Version, SlotSize: 4096, Credits: 64, Inline: 4000, MaxMessage: 1 << 26}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Hello
		rest, err := ParseHello(b, &h)
		if refused := RefusalError(b); refused != nil && (err == nil || !errors.Is(refused, ErrRefused)) {
			t.Fatalf("%x parses as a hello and as a refusal (%v)", b, refused)
		}
		if err != nil {
			return
		}
		if enc := AppendHello(nil, &h); !bytes.Equal(enc, b[:HelloLen]) || len(rest) != len(b)-HelloLen {
			t.Fatalf("accepted %x, re-encodes to %x", b[:HelloLen], enc)
		}
	})
}

func TestRefusal(t *testing.T) {
	for _, r := range []Refusal{RefusedConns, RefusedHost, RefusedClosing, RefusedRate} {
		b := AppendRefusal(nil, r)
		if len(b) != HelloLen {
			t.Fatalf("%v: refusal of %d bytes, want %d (as long as a hello)", r, len(b), HelloLen)
		}
		var h Hello
		if _, err := ParseHello(b, &h); err == nil {
			t.Fatalf("%v: a refusal parses as a hello", r)
		}
		for _, n := range []int{5, HelloLen} { // a TLS client sees only a record header's five bytes
			err := RefusalError(b[:n])
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), r.String()) {
				t.Fatalf("%v from %d bytes: %v", r, n, err)
			}
		}
	}
	if err := RefusalError(AppendHello(nil, &Hello{Version: Version, SlotSize: 4096, Credits: 64, MaxMessage: 1})); err != nil {
		t.Fatalf("a hello reads as a refusal: %v", err)
	}
	if err := RefusalError([]byte("MWN")); err != nil {
		t.Fatalf("three bytes read as a refusal: %v", err)
	}
}
