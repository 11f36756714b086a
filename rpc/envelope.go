package rpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"slices"
)

// The rpc envelope rides inside a transport message, in front of the encoded body.
//
// Request:  version u8 | flags u8 | method len u16 | md count u16 | reserved u16 |
//
//	deadline i64 (unix nanoseconds, 0: none) | method | md entries | body
//
// Response: version u8 | flags u8 | md count u16 | message len u32 |
//
//	[header md count u16 | reserved u16 | header md entries] | md entries |
//	message (a failed call's status message) | body
//
// After the header section, when flags has respDetails: details len u32 | details (a
// failed status's typed details, msgpack: see details.go).
//
// The bracketed part is there when flags has respHeader: the response headers
// (SetHeader) a unary call's response, or a stream's end that sent none before, carries;
// the other md entries are the trailer.
//
// A stream's header message (SendHeader) is: header md count u16 | reserved u16 | entries.
//
// An md entry is key len u16 | key | value len u32 | value; a key with several values
// appears once per value. The status code itself is the transport header's status field.
const (
	envVersion     = 1
	reqFixed       = 16
	respFixed      = 8
	maxMethodLen   = 1024
	maxMDEntries   = 1024
	maxMDKeyLen    = 1024
	maxMDTotalSize = 1 << 20
	respHeader     = 1 // response flag: a header md section follows the fixed part
	respDetails    = 2 // response flag: a status details section follows (the header section)
)

// errEnvelope is wrapped by every envelope parse failure.
var errEnvelope = errors.New("mwrpc: malformed envelope")

type request struct {
	whole    []byte // the message: envelope and body
	method   []byte
	deadline int64
	nmd      int
	md       []byte // the md entries, parsed on demand
	body     []byte
}

type response struct {
	details []byte // a failed status's details, decoded on demand
	nhdr    int
	hdr     []byte // the header md entries, parsed on demand
	nmd     int
	md      []byte
	msg     []byte
	body    []byte
}

func appendMD(b []byte, md MD) ([]byte, int) {
	if len(md) == 0 { // most calls: no sort, no key slice
		return b, 0
	}
	n := 0
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys) // deterministic bytes
	for _, k := range keys {
		for _, v := range md[k] {
			b = appendMDEntry(b, k, v)
			n++
		}
	}
	return b, n
}

// appendMDEntry appends one md entry.
func appendMDEntry(b []byte, k, v string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(k)))
	b = append(b, k...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// mdEntries yields the n md entries of b, which skipMD has checked.
func mdEntries(b []byte, n int) iter.Seq2[[]byte, []byte] {
	return func(yield func(k, v []byte) bool) {
		off := 0
		for i := 0; i < n; i++ {
			kl := int(binary.LittleEndian.Uint16(b[off:]))
			k := b[off+2 : off+2+kl]
			off += 2 + kl
			vl := int(binary.LittleEndian.Uint32(b[off:]))
			v := b[off+4 : off+4+vl]
			off += 4 + vl
			if !yield(k, v) {
				return
			}
		}
	}
}

func checkMD(md MD) error {
	n, size := 0, 0
	for k, vs := range md {
		if len(k) == 0 || len(k) > maxMDKeyLen {
			return fmt.Errorf("mwrpc: metadata key %q: length must be 1..%d", k, maxMDKeyLen)
		}
		n += len(vs)
		size += len(k) * len(vs)
		for _, v := range vs {
			size += len(v)
		}
	}
	if n > maxMDEntries || size > maxMDTotalSize {
		return fmt.Errorf("mwrpc: metadata of %d entries and %d bytes exceeds %d entries or %d bytes", n, size, maxMDEntries, maxMDTotalSize)
	}
	return nil
}

// checkRequest validates what appendRequest encodes in fixed-width fields.
func checkRequest(method string, md MD) error {
	if len(method) == 0 || len(method) > maxMethodLen {
		return fmt.Errorf("mwrpc: method name of %d bytes (1..%d)", len(method), maxMethodLen)
	}
	return checkMD(md)
}

// appendRequest appends a request envelope (everything but the body) to b.
func appendRequest(b []byte, method string, deadline int64, md MD) []byte {
	b = append(b, envVersion, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(method)))
	at := len(b)
	b = append(b, 0, 0, 0, 0) // md count, reserved
	b = binary.LittleEndian.AppendUint64(b, uint64(deadline))
	b = append(b, method...)
	var n int
	b, n = appendMD(b, md)
	binary.LittleEndian.PutUint16(b[at:], uint16(n))
	return b
}

// appendResponse appends a response envelope (everything but the body) to b: header, if
// not empty, the trailer md and a failed call's message.
func appendResponse(b []byte, header, md MD, msg string) []byte {
	return appendResponseDetails(b, header, md, msg, nil)
}

// appendResponseDetails is appendResponse with a failed status's encoded details.
func appendResponseDetails(b []byte, header, md MD, msg string, details []byte) []byte {
	flags := byte(0)
	if len(header) > 0 {
		flags |= respHeader
	}
	if len(details) > 0 {
		flags |= respDetails
	}
	b = append(b, envVersion, flags)
	at := len(b)
	b = append(b, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	if len(header) > 0 {
		b = appendHeaderMD(b, header)
	}
	if len(details) > 0 {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(details)))
		b = append(b, details...)
	}
	var n int
	b, n = appendMD(b, md)
	binary.LittleEndian.PutUint16(b[at:], uint16(n))
	return append(b, msg...)
}

// skipMD checks n md entries at the front of b and returns their length.
func skipMD(b []byte, n int) (int, error) {
	off := 0
	for i := 0; i < n; i++ {
		if len(b)-off < 2 {
			return 0, fmt.Errorf("%w: metadata entry %d truncated", errEnvelope, i)
		}
		kl := int(binary.LittleEndian.Uint16(b[off:]))
		off += 2
		if kl == 0 || kl > maxMDKeyLen || len(b)-off < kl+4 {
			return 0, fmt.Errorf("%w: metadata key %d of %d bytes", errEnvelope, i, kl)
		}
		off += kl
		vl := binary.LittleEndian.Uint32(b[off:]) // compared unsigned: no overflow on 32 bits
		off += 4
		if uint64(vl) > uint64(len(b)-off) {
			return 0, fmt.Errorf("%w: metadata value %d of %d bytes, %d left", errEnvelope, i, vl, len(b)-off)
		}
		off += int(vl)
	}
	return off, nil
}

func parseRequest(b []byte, r *request) error {
	if len(b) < reqFixed {
		return fmt.Errorf("%w: request of %d bytes, the envelope alone is %d", errEnvelope, len(b), reqFixed)
	}
	if b[0] != envVersion || b[1] != 0 || b[6] != 0 || b[7] != 0 {
		return fmt.Errorf("%w: version %d, flags %d", errEnvelope, b[0], b[1])
	}
	ml := int(binary.LittleEndian.Uint16(b[2:]))
	r.nmd = int(binary.LittleEndian.Uint16(b[4:]))
	r.deadline = int64(binary.LittleEndian.Uint64(b[8:]))
	rest := b[reqFixed:]
	if ml == 0 || ml > maxMethodLen || ml > len(rest) {
		return fmt.Errorf("%w: method name of %d bytes", errEnvelope, ml)
	}
	if r.nmd > maxMDEntries {
		return fmt.Errorf("%w: %d metadata entries", errEnvelope, r.nmd)
	}
	r.method, rest = rest[:ml], rest[ml:]
	n, err := skipMD(rest, r.nmd)
	if err != nil {
		return err
	}
	r.whole, r.md, r.body = b, rest[:n], rest[n:]
	return nil
}

func parseResponse(b []byte, r *response) error {
	if len(b) < respFixed {
		return fmt.Errorf("%w: response of %d bytes, the envelope alone is %d", errEnvelope, len(b), respFixed)
	}
	if b[0] != envVersion || b[1]&^(respHeader|respDetails) != 0 {
		return fmt.Errorf("%w: version %d, flags %d", errEnvelope, b[0], b[1])
	}
	r.nmd = int(binary.LittleEndian.Uint16(b[2:]))
	msgLen := binary.LittleEndian.Uint32(b[4:])
	rest := b[respFixed:]
	r.nhdr, r.hdr = 0, nil
	if b[1]&respHeader != 0 {
		n, err := parseHeaderMD(rest, &r.nhdr, &r.hdr)
		if err != nil {
			return err
		}
		rest = rest[n:]
	}
	r.details = nil
	if b[1]&respDetails != 0 {
		if len(rest) < 4 {
			return fmt.Errorf("%w: status details truncated", errEnvelope)
		}
		dl := binary.LittleEndian.Uint32(rest)
		if dl > maxDetailBytes || uint64(dl) > uint64(len(rest)-4) {
			return fmt.Errorf("%w: status details of %d bytes, %d left (at most %d)", errEnvelope, dl, len(rest)-4, maxDetailBytes)
		}
		r.details, rest = rest[4:4+dl], rest[4+dl:]
	}
	if r.nmd > maxMDEntries {
		return fmt.Errorf("%w: %d metadata entries", errEnvelope, r.nmd)
	}
	n, err := skipMD(rest, r.nmd)
	if err != nil {
		return err
	}
	r.md, rest = rest[:n], rest[n:]
	if uint64(msgLen) > uint64(len(rest)) {
		return fmt.Errorf("%w: status message of %d bytes, %d left", errEnvelope, msgLen, len(rest))
	}
	r.msg, r.body = rest[:msgLen], rest[msgLen:]
	return nil
}

// decodeMD turns checked md entries into an MD (copying them out of the message).
func decodeMD(b []byte, n int) MD {
	if n == 0 {
		return nil
	}
	md := make(MD, n)
	for k, v := range mdEntries(b, n) {
		md[string(k)] = append(md[string(k)], string(v))
	}
	return md
}

// appendHeaderMD appends a header md section: count u16, reserved u16, entries.
func appendHeaderMD(b []byte, md MD) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	var n int
	b, n = appendMD(b, md)
	binary.LittleEndian.PutUint16(b[at:], uint16(n))
	return b
}

// parseHeaderMD checks the header md section at the front of b, setting its count and
// entries, and returns its length.
func parseHeaderMD(b []byte, n *int, entries *[]byte) (int, error) {
	if len(b) < 4 {
		return 0, fmt.Errorf("%w: header metadata of %d bytes", errEnvelope, len(b))
	}
	*n = int(binary.LittleEndian.Uint16(b))
	if *n > maxMDEntries || b[2] != 0 || b[3] != 0 {
		return 0, fmt.Errorf("%w: header metadata of %d entries, reserved %d", errEnvelope, *n, binary.LittleEndian.Uint16(b[2:]))
	}
	l, err := skipMD(b[4:], *n)
	if err != nil {
		return 0, err
	}
	*entries = b[4 : 4+l]
	return 4 + l, nil
}

// parseHeaderMsg decodes a stream's header message (all of p is the section).
func parseHeaderMsg(p []byte) (MD, error) {
	var n int
	var entries []byte
	l, err := parseHeaderMD(p, &n, &entries)
	if err != nil {
		return nil, err
	}
	if l != len(p) {
		return nil, fmt.Errorf("%w: %d bytes after the header metadata", errEnvelope, len(p)-l)
	}
	return decodeMD(entries, n), nil
}
