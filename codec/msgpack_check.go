package codec

import (
	"encoding/binary"
	"fmt"
)

// checkMsgpack reports whether data is exactly one well-formed MessagePack value with
// arrays and maps nested at most maxDepth deep. It walks the headers only (string, binary
// and extension payloads are stepped over), allocates nothing on success, and rejects
// every length that runs past the end of data; since each array element and map entry
// takes at least one byte, a container's length is bounded by the bytes left, which in
// turn bounds what the decoder preallocates. The msgpack decoder trusts lengths (a bin32
// header alone makes it allocate up to 4 GiB) and recurses without a limit; this check
// runs first so that neither is reachable from the wire.
func checkMsgpack(data []byte) error {
	end, err := skipMsgpack(data, 0, maxDepth)
	if err != nil {
		return err
	}
	if end != len(data) {
		return fmt.Errorf("%d trailing bytes after the value at offset %d", len(data)-end, end)
	}
	return nil
}

// skipMsgpack returns the offset just past the value that starts at data[off], which is
// allowed depth more levels of nesting.
func skipMsgpack(data []byte, off, depth int) (int, error) {
	if off >= len(data) {
		return 0, fmt.Errorf("truncated: a value expected at offset %d, past the end", off)
	}
	start, c := off, data[off]
	off++
	sh := &msgpackShapes[c]
	switch {
	case sh.reserved:
		return 0, fmt.Errorf("reserved code 0xc1 at offset %d", start)
	case sh.bare:
		return off, nil
	}
	n := uint64(sh.n)
	if lenSize := int(sh.lenSize); lenSize > 0 {
		if len(data)-off < lenSize {
			return 0, fmt.Errorf("truncated: code 0x%02x at offset %d needs a %d-byte length, %d bytes left", c, start, lenSize, len(data)-off)
		}
		n += readLength(data[off:], lenSize)
		off += lenSize
	}
	left := uint64(len(data) - off)
	if sh.elems == 0 { // a scalar, string, binary or extension: step over n bytes
		if n > left {
			return 0, fmt.Errorf("truncated: code 0x%02x at offset %d needs %d more bytes, %d left", c, start, n, left)
		}
		return off + int(n), nil
	}
	if n > left/uint64(sh.elems) {
		return 0, fmt.Errorf("truncated: container 0x%02x at offset %d has %d elements, %d bytes left", c, start, n, left)
	}
	if depth == 0 {
		return 0, fmt.Errorf("container at offset %d nested more than %d deep", start, maxDepth)
	}
	var err error
	for i := uint64(0); i < n*uint64(sh.elems); i++ {
		if off, err = skipMsgpack(data, off, depth-1); err != nil {
			return 0, err
		}
	}
	return off, nil
}

// msgpackShape is what a MessagePack type code says about the value it starts.
type msgpackShape struct {
	n        uint8 // payload bytes to step over (plus the length field's), or container elements
	lenSize  uint8 // bytes of the length field that follows the code
	elems    uint8 // values per container element: 1 for arrays, 2 for maps, 0 for the rest
	bare     bool  // the code is the whole value: fixint, nil, false, true
	reserved bool  // 0xc1, which no value starts with
}

// msgpackShapes is shapeOf of every code, so that the check's path reads a value's shape
// with one load: calling shapeOf for each value made BenchmarkCheckMsgpack 2.5-4x slower.
var msgpackShapes = func() (t [256]msgpackShape) {
	for c := range t {
		t[c] = shapeOf(byte(c))
	}
	return t
}()

// shapeOf reads a MessagePack type code (the spec's format table).
func shapeOf(c byte) msgpackShape {
	switch {
	case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		return msgpackShape{bare: true}
	case c <= 0x8f: // fixmap
		return msgpackShape{n: c & 0x0f, elems: 2}
	case c <= 0x9f: // fixarray
		return msgpackShape{n: c & 0x0f, elems: 1}
	case c <= 0xbf: // fixstr
		return msgpackShape{n: c & 0x1f}
	}
	switch c {
	case 0xc0, 0xc2, 0xc3: // nil, false, true
		return msgpackShape{bare: true}
	case 0xc1:
		return msgpackShape{reserved: true}
	case 0xc4, 0xd9: // bin8, str8
		return msgpackShape{lenSize: 1}
	case 0xc5, 0xda: // bin16, str16
		return msgpackShape{lenSize: 2}
	case 0xc6, 0xdb: // bin32, str32
		return msgpackShape{lenSize: 4}
	case 0xc7, 0xc8: // ext8, ext16: length, type, data
		return msgpackShape{lenSize: c - 0xc7 + 1, n: 1}
	case 0xc9: // ext32
		return msgpackShape{lenSize: 4, n: 1}
	case 0xcc, 0xd0: // uint8, int8
		return msgpackShape{n: 1}
	case 0xcd, 0xd1: // uint16, int16
		return msgpackShape{n: 2}
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return msgpackShape{n: 4}
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return msgpackShape{n: 8}
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type, data
		return msgpackShape{n: 1 + 1<<(c-0xd4)}
	case 0xdc, 0xdd: // array16, array32
		return msgpackShape{lenSize: 2 << (c - 0xdc), elems: 1}
	default: // 0xde, 0xdf: map16, map32
		return msgpackShape{lenSize: 2 << (c - 0xde), elems: 2}
	}
}

// readLength reads a big-endian length field of size bytes (1, 2 or 4) at the start of b.
func readLength(b []byte, size int) uint64 {
	switch size {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(b))
	default:
		return uint64(binary.BigEndian.Uint32(b))
	}
}
