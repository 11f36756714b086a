package shm

import "fmt"

// Hello, the one message each side sends at setup, 16 bytes, little-endian, with three
// descriptors (SCM_RIGHTS): the ring the sender receives on (a sealed memfd), the
// doorbell its reader sleeps on and the one its writer sleeps on (eventfds).
//
//	magic "MWSHMHEL" | version u16 | reserved u16 (0) | log2 of the ring's data size u32
const (
	helloLen     = 16
	helloVersion = 1
	helloFDs     = 3
)

var helloMagic = [8]byte{'M', 'W', 'S', 'H', 'M', 'H', 'E', 'L'}

// appendHello appends the hello announcing a ring of ringSize bytes.
func appendHello(b []byte, ringSize int) []byte {
	b = append(b, helloMagic[:]...)
	b = append(b, helloVersion, 0, 0, 0)
	l := uint32(log2(ringSize))
	return append(b, byte(l), byte(l>>8), byte(l>>16), byte(l>>24))
}

// parseHello returns the ring size a peer's hello announces.
func parseHello(b []byte) (int, error) {
	if len(b) != helloLen {
		return 0, fmt.Errorf("hello of %d bytes, want %d: %w", len(b), helloLen, ErrProtocol)
	}
	if [8]byte(b[:8]) != helloMagic {
		return 0, fmt.Errorf("hello magic %q, want %q: %w", b[:8], helloMagic[:], ErrProtocol)
	}
	if v := uint16(b[8]) | uint16(b[9])<<8; v != helloVersion {
		return 0, fmt.Errorf("hello version %d, this side speaks %d: %w", v, helloVersion, ErrProtocol)
	}
	if b[10] != 0 || b[11] != 0 {
		return 0, fmt.Errorf("hello's reserved bytes are %x: %w", b[10:12], ErrProtocol)
	}
	l := uint32(b[12]) | uint32(b[13])<<8 | uint32(b[14])<<16 | uint32(b[15])<<24
	if l >= 31 || !validRingSize(1<<l) {
		return 0, fmt.Errorf("hello asks for a ring of 1<<%d bytes (allowed [%d, %d]): %w", l, MinRingSize, MaxRingSize, ErrProtocol)
	}
	return 1 << l, nil
}
