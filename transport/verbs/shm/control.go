package shm

import (
	"encoding/binary"
	"fmt"
)

// A control message goes over the connection's Unix socket after the hello, 24 bytes,
// little-endian:
//
//	magic (8) | region id u32 | reserved u32 (0) | size u64
//
// "MWSHMREG" announces a region of this side's registered memory, with its sealed memfd
// (one descriptor, SCM_RIGHTS); ids count up from 0 on each side. "MWSHMMAP" answers it,
// without a descriptor, once the peer has mapped that region: from then on the announcer's
// READs name destinations in it (soft.SharedMemoryWire), and not before, so a READ never
// names memory the peer cannot yet reach. Config.PrivateMemory announces nothing.
const (
	controlLen = 24
	// maxRegions bounds the regions one side announces on a connection (the pool's slabs;
	// memory beyond them is read the ring's way) and so what a peer can make this side map.
	maxRegions = 1024
	// maxRegionSize bounds one announced region: larger is refused as a protocol error.
	maxRegionSize = 1 << 40
)

var (
	regionMagic = [8]byte{'M', 'W', 'S', 'H', 'M', 'R', 'E', 'G'}
	mappedMagic = [8]byte{'M', 'W', 'S', 'H', 'M', 'M', 'A', 'P'}
)

// control is a parsed control message.
type control struct {
	mapped bool   // "MWSHMMAP": the peer mapped region id; else a region announced
	id     uint32 // the region
	size   uint64 // its bytes
}

func appendControl(b []byte, m control) []byte {
	if m.mapped {
		b = append(b, mappedMagic[:]...)
	} else {
		b = append(b, regionMagic[:]...)
	}
	b = binary.LittleEndian.AppendUint32(b, m.id)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return binary.LittleEndian.AppendUint64(b, m.size)
}

// parseControl parses a control message from the peer, which came with nfds descriptors.
func parseControl(b []byte, nfds int) (control, error) {
	var m control
	if len(b) != controlLen {
		return m, fmt.Errorf("control message of %d bytes, want %d: %w", len(b), controlLen, ErrProtocol)
	}
	switch [8]byte(b[:8]) {
	case regionMagic:
	case mappedMagic:
		m.mapped = true
	default:
		return m, fmt.Errorf("control message magic %q: %w", b[:8], ErrProtocol)
	}
	if r := binary.LittleEndian.Uint32(b[12:]); r != 0 {
		return m, fmt.Errorf("control message's reserved word is 0x%x: %w", r, ErrProtocol)
	}
	m.id, m.size = binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint64(b[16:])
	switch {
	case m.id >= maxRegions:
		return m, fmt.Errorf("region id %d, at most %d regions: %w", m.id, maxRegions, ErrProtocol)
	case m.size == 0 || m.size > maxRegionSize:
		return m, fmt.Errorf("region %d of %d bytes (want 1 to %d): %w", m.id, m.size, uint64(maxRegionSize), ErrProtocol)
	case !m.mapped && nfds != 1:
		return m, fmt.Errorf("region %d announced with %d descriptors, want 1: %w", m.id, nfds, ErrProtocol)
	case m.mapped && nfds != 0:
		return m, fmt.Errorf("region %d's answer carried %d descriptors, want none: %w", m.id, nfds, ErrProtocol)
	}
	return m, nil
}
