package soft

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range seedHeaders() {
		b := appendHeader(nil, &h)
		if len(b) != headerLen {
			t.Fatalf("%v: encoded %d bytes, want %d", h.op, len(b), headerLen)
		}
		var got header
		rest, err := parseHeader(append(b, 7), &got)
		if err != nil {
			t.Fatalf("%v: %v", h.op, err)
		}
		if got != h || len(rest) != 1 {
			t.Fatalf("round trip: got %+v rest %d, want %+v", got, len(rest), h)
		}
	}
}

func TestParseHeaderRejects(t *testing.T) {
	valid := appendHeader(nil, &header{op: opSend, psn: 1, len: 10})
	if len(valid) != headerLen {
		t.Fatalf("header of %d bytes", len(valid))
	}
	mut := func(f func(b []byte)) []byte { b := append([]byte(nil), valid...); f(b); return b }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"short", valid[:31]},
		{"opcode zero", mut(func(b []byte) { b[0] = 0 })},
		{"opcode unknown", mut(func(b []byte) { b[0] = byte(opMax) })},
		{"reserved flags", mut(func(b []byte) { b[2] = 8 })},
		{"reserved flags, high byte", mut(func(b []byte) { b[3] = 1 })},
		{"ack request on a READ request", mut(func(b []byte) { b[0] = byte(opReadReq); b[2] = flagAckReq; b[8] = 0 })},
		{"ack request on a READ response", mut(func(b []byte) { b[0] = byte(opReadResp); b[2] = flagAckReq })},
		{"ack request on an ACK", mut(func(b []byte) { b[0] = byte(opAck); b[2] = flagAckReq; b[8] = 0 })},
		{"ack request on a NAK", mut(func(b []byte) { b[0] = byte(opNak); b[1] = byte(synRNR); b[2] = flagAckReq; b[8] = 0 })},
		{"placed send", mut(func(b []byte) { b[2] = flagPlaced })},
		{"placed read without placement", mut(func(b []byte) { b[0] = byte(opReadReq); b[2] = flagPlaced; b[8] = 0 })},
		{"placed read, long placement", mut(func(b []byte) { b[0] = byte(opReadReq); b[2] = flagPlaced; b[8] = placementLen + 1 })},
		{"placed response with payload", mut(func(b []byte) { b[0] = byte(opReadResp); b[2] = flagPlaced })},
		{"placed response with offset", mut(func(b []byte) { b[0] = byte(opReadResp); b[2] = flagPlaced; b[8] = 0; b[20] = 1 })},
		{"placed response too long", mut(func(b []byte) { b[0] = byte(opReadResp); b[2] = flagPlaced; b[8] = 0; b[31] = 0x80 })},
		{"placed send of nothing", mut(func(b []byte) { b[2] = flagPlaced; b[8] = placementLen })},
		{"placed send, five placements", mut(func(b []byte) { b[2] = flagPlaced; b[8] = 5 * placementLen; b[28] = 1 })},
		{"placed send, no placement", mut(func(b []byte) { b[2] = flagPlaced; b[8] = 0; b[28] = 1 })},
		{"placed send too long", mut(func(b []byte) { b[2] = flagPlaced; b[8] = placementLen; b[31] = 0x80 })},
		{"placed write with immediate", mut(func(b []byte) { b[0] = byte(opWriteImm); b[2] = flagPlaced; b[8] = placementLen; b[28] = 1 })},
		{"ack without flag", mut(func(b []byte) { b[32] = 1 })},
		{"ack too wide", mut(func(b []byte) { b[2] = 1; b[35] = 1 })},
		{"psn too wide", mut(func(b []byte) { b[7] = 1 })},
		{"payload too large", mut(func(b []byte) { b[11] = 0x80 })},
		{"ack with payload", mut(func(b []byte) { b[0] = byte(opAck) })},
		{"nak without syndrome", mut(func(b []byte) { b[0] = byte(opNak); b[8] = 0 })},
		{"nak unknown syndrome", mut(func(b []byte) { b[0] = byte(opNak); b[1] = byte(synMax); b[8] = 0 })},
		{"send with syndrome", mut(func(b []byte) { b[1] = byte(synRNR) })},
		{"read too long", mut(func(b []byte) { b[0] = byte(opReadReq); b[8] = 0; b[31] = 0x80 })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h header
			if _, err := parseHeader(tc.b, &h); !errors.Is(err, errFrame) {
				t.Fatalf("parseHeader(%x) = %v, want errFrame", tc.b, err)
			}
		})
	}
}

func seedHeaders() []header {
	return []header{
		{op: opSend, psn: 1, len: 64},
		{op: opSendImm, psn: 2, len: 0, imm: 0xdeadbeef},
		{op: opSendInv, psn: 3, len: 5, imm: 0x1234},
		{op: opWrite, psn: 4, len: 1 << 20, rkey: 0x100, raddr: 0x7f0000001000},
		{op: opWriteImm, psn: 5, len: 1, rkey: 0x100, raddr: 8, imm: 1},
		{op: opReadReq, psn: psnMask, rkey: 0x2201, raddr: 0x7f0000002000, rlen: 1 << 20},
		{op: opReadResp, psn: 6, len: 1 << 20},
		{op: opSend, flags: flagAck, psn: 10, len: 3, ack: psnMask},
		{op: opAck, psn: 7},
		{op: opNak, syn: synRNR, psn: 8},
		{op: opNak, syn: synAccess, psn: 9},
		{op: opReadReq, flags: flagPlaced, psn: 11, len: placementLen, rkey: 0x2201, raddr: 0x7f0000002000, rlen: 1 << 20},
		{op: opReadResp, flags: flagPlaced | flagAck, psn: 11, rlen: 1 << 20, ack: 4},
		{op: opWrite, flags: flagPlaced, psn: 12, len: placementLen, rkey: 0x100, raddr: 0x7f0000001000, rlen: 1 << 20},
		{op: opSendInv, flags: flagPlaced, psn: 13, len: 2 * placementLen, imm: 0x4401, rlen: 4096 + 64},
		{op: opSend, flags: flagAckReq, psn: 14, len: 64},
		{op: opWriteImm, flags: flagAckReq | flagAck, psn: 15, len: 8, rkey: 0x100, raddr: 64, imm: 2, ack: 9},
		{op: opWrite, flags: flagAckReq | flagPlaced, psn: 16, len: placementLen, rkey: 0x100, raddr: 0x7f0000001000, rlen: 4096},
	}
}

// FuzzParseHeader checks that no input crashes the frame parser and that every header it
// accepts encodes back to the same bytes.
func FuzzParseHeader(f *testing.F) {
	for _, h := range seedHeaders() {
		f.Add(appendHeader(nil, &h))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		rest, err := parseHeader(b, &h)
		if err != nil {
			return
		}
		if len(rest) != len(b)-headerLen {
			t.Fatalf("consumed %d bytes", len(b)-len(rest))
		}
		if enc := appendHeader(nil, &h); string(enc) != string(b[:headerLen]) {
			t.Fatalf("re-encoded %x, parsed from %x", enc, b[:headerLen])
		}
	})
}

// FuzzPlacement: a placed READ's destination, bytes from the peer, parses to a placement
// that encodes back to the same bytes, or fails as a malformed frame.
func FuzzPlacement(f *testing.F) {
	f.Add(appendPlacement(nil, Placement{Region: 3, Offset: 1 << 20}))
	f.Add(make([]byte, placementLen+1))
	f.Add([]byte("\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePlacement(b)
		if err != nil {
			if !errors.Is(err, errFrame) {
				t.Fatalf("%v is not errFrame", err)
			}
			return
		}
		if again := appendPlacement(nil, p); !bytes.Equal(again, b) {
			t.Fatalf("placement %x parsed to %+v, which encodes as %x", b, p, again)
		}
	})
}

// FuzzSendPlacement: one of a placed SEND's placements, bytes from the peer, parses to a
// placement of a segment that is not empty and encodes back to the same bytes, or fails
// as a malformed frame.
func FuzzSendPlacement(f *testing.F) {
	f.Add(appendSendPlacement(nil, Placement{Region: 3, Offset: 1 << 20}, 4096))
	f.Add(appendPlacement(nil, Placement{Region: 1, Offset: 64})) // a READ's: no length
	f.Add(make([]byte, placementLen-1))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, n, err := parseSendPlacement(b)
		if err != nil {
			if !errors.Is(err, errFrame) {
				t.Fatalf("%v is not errFrame", err)
			}
			return
		}
		if n <= 0 {
			t.Fatalf("placement %x parsed to a segment of %d bytes", b, n)
		}
		if again := appendSendPlacement(nil, p, n); !bytes.Equal(again, b) {
			t.Fatalf("placement %x parsed to %+v, %d bytes, which encodes as %x", b, p, n, again)
		}
	})
}
