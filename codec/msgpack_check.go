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
	start := off
	c := data[off]
	off++
	var (
		n       uint64 // payload bytes to step over, or container elements
		lenSize int    // bytes of the length field that follows c
		elems   int    // values per container element: 1 for arrays, 2 for maps
	)
	switch {
	case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		return off, nil
	case c <= 0x8f: // fixmap
		n, elems = uint64(c&0x0f), 2
	case c <= 0x9f: // fixarray
		n, elems = uint64(c&0x0f), 1
	case c <= 0xbf: // fixstr
		n = uint64(c & 0x1f)
	default:
		switch c {
		case 0xc0, 0xc2, 0xc3: // nil, false, true
			return off, nil
		case 0xc1:
			return 0, fmt.Errorf("reserved code 0xc1 at offset %d", start)
		case 0xc4, 0xd9: // bin8, str8
			lenSize = 1
		case 0xc5, 0xda: // bin16, str16
			lenSize = 2
		case 0xc6, 0xdb: // bin32, str32
			lenSize = 4
		case 0xc7: // ext8: length, type, data
			lenSize, n = 1, 1
		case 0xc8: // ext16
			lenSize, n = 2, 1
		case 0xc9: // ext32
			lenSize, n = 4, 1
		case 0xcc, 0xd0: // uint8, int8
			n = 1
		case 0xcd, 0xd1: // uint16, int16
			n = 2
		case 0xca, 0xce, 0xd2: // float32, uint32, int32
			n = 4
		case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
			n = 8
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type, data
			n = 1 + 1<<(c-0xd4)
		case 0xdc: // array16
			lenSize, elems = 2, 1
		case 0xdd: // array32
			lenSize, elems = 4, 1
		case 0xde: // map16
			lenSize, elems = 2, 2
		case 0xdf: // map32
			lenSize, elems = 4, 2
		}
	}
	if lenSize > 0 {
		if len(data)-off < lenSize {
			return 0, fmt.Errorf("truncated: code 0x%02x at offset %d needs a %d-byte length, %d bytes left", c, start, lenSize, len(data)-off)
		}
		var l uint64
		switch lenSize {
		case 1:
			l = uint64(data[off])
		case 2:
			l = uint64(binary.BigEndian.Uint16(data[off:]))
		default:
			l = uint64(binary.BigEndian.Uint32(data[off:]))
		}
		off += lenSize
		n += l
	}
	left := uint64(len(data) - off)
	if elems == 0 { // a scalar, string, binary or extension: step over n bytes
		if n > left {
			return 0, fmt.Errorf("truncated: code 0x%02x at offset %d needs %d more bytes, %d left", c, start, n, left)
		}
		return off + int(n), nil
	}
	if n > left/uint64(elems) {
		return 0, fmt.Errorf("truncated: container 0x%02x at offset %d has %d elements, %d bytes left", c, start, n, left)
	}
	if depth == 0 {
		return 0, fmt.Errorf("container at offset %d nested more than %d deep", start, maxDepth)
	}
	var err error
	for i := uint64(0); i < n*uint64(elems); i++ {
		if off, err = skipMsgpack(data, off, depth-1); err != nil {
			return 0, err
		}
	}
	return off, nil
}
