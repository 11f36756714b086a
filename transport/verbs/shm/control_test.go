package shm

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzControl: any control message parses to a valid one (id and size in range, the
// descriptors it should carry) or fails with ErrProtocol, and a parsed one encodes back to
// the same bytes.
func FuzzControl(f *testing.F) {
	f.Add(appendControl(nil, control{id: 0, size: 1 << 20}), 1)
	f.Add(appendControl(nil, control{mapped: true, id: 3, size: 4096}), 0)
	f.Add(appendControl(nil, control{id: maxRegions, size: 1}), 1)
	f.Add([]byte("MWSHMREG\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"), 2)
	f.Fuzz(func(t *testing.T, b []byte, nfds int) {
		m, err := parseControl(b, nfds)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("%v is not ErrProtocol", err)
			}
			return
		}
		if m.id >= maxRegions || m.size == 0 || m.size > maxRegionSize {
			t.Fatalf("parsed an invalid message %+v", m)
		}
		if m.mapped && nfds != 0 || !m.mapped && nfds != 1 {
			t.Fatalf("parsed %+v with %d descriptors", m, nfds)
		}
		if again := appendControl(nil, m); !bytes.Equal(again, b) {
			t.Fatalf("message %x parsed to %+v, which encodes as %x", b, m, again)
		}
	})
}

// TestSharesWith: registered memory is shared with a peer of this process's own user by
// default, with another (allowed) user only when the configuration opts in, and with no one
// under PrivateMemory.
func TestSharesWith(t *testing.T) {
	const self, other = 1000, 1001
	for _, tc := range []struct {
		name string
		cfg  Config
		uid  uint32
		want bool
	}{
		{"same user, default", Config{}, self, true},
		{"other user, default", Config{PeerUIDs: []uint32{self, other}}, other, false},
		{"other user, opted in", Config{PeerUIDs: []uint32{other}, ShareWithOtherUsers: true}, other, true},
		{"same user, private", Config{PrivateMemory: true}, self, false},
		{"other user, opted in but private", Config{ShareWithOtherUsers: true, PrivateMemory: true}, other, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.cfg.sharesWith(tc.uid, self); got != tc.want {
				t.Fatalf("sharesWith(%d) = %v, want %v", tc.uid, got, tc.want)
			}
		})
	}
}
