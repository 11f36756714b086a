package shm

import (
	"errors"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"golang.org/x/sys/unix"
)

// TestHostileRegion: a peer whose region announcement (or answer) is not what the
// protocol says fails that connection with ErrProtocol, naming what was wrong, and maps
// nothing; the descriptors it sent are closed, and another connection goes on.
func TestHostileRegion(t *testing.T) {
	memfd := func(t *testing.T, size int, seals int) int {
		fd, err := unix.MemfdCreate("hostile-region", unix.MFD_ALLOW_SEALING|unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Ftruncate(fd, int64(size))
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	sealed := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	for _, tc := range []struct {
		name string
		msg  control
		fd   func(t *testing.T) int // -1: no descriptor
	}{
		{"not sealed against shrinking", control{id: 0, size: 4096}, func(t *testing.T) int { return memfd(t, 4096, 0) }},
		{"only sealed against growing", control{id: 0, size: 4096}, func(t *testing.T) int { return memfd(t, 4096, unix.F_SEAL_GROW) }},
		{"smaller than announced", control{id: 0, size: 8192}, func(t *testing.T) int { return memfd(t, 4096, sealed) }},
		{"larger than announced", control{id: 0, size: 4096}, func(t *testing.T) int { return memfd(t, 8192, sealed) }},
		{"not a memfd", control{id: 0, size: 4096}, func(t *testing.T) int {
			fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			return fd
		}},
		{"id out of order", control{id: 1, size: 4096}, func(t *testing.T) int { return memfd(t, 4096, sealed) }},
		{"no descriptor", control{id: 0, size: 4096}, func(*testing.T) int { return -1 }},
		{"answer for a region never announced", control{mapped: true, id: 0, size: 4096}, func(*testing.T) int { return -1 }},
		{"size zero", control{id: 0, size: 0}, func(t *testing.T) int { return memfd(t, 4096, sealed) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leakcheck.Check(t)
			leakcheck.CheckHeld(t)
			attacker, victim := connPair(t, Config{}, Config{})
			ok1, ok2 := connPair(t, Config{}, Config{})
			var oob []byte
			if fd := tc.fd(t); fd >= 0 {
				oob = unix.UnixRights(fd)
				defer unix.Close(fd)
			}
			if _, _, err := attacker.sock.WriteMsgUnix(appendControl(nil, tc.msg), oob, nil); err != nil {
				t.Fatal(err)
			}
			victim.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := victim.Read(make([]byte, 1))
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("victim: %v, want ErrProtocol", err)
			}
			t.Logf("victim: %v", err)
			victim.peerMu.RLock()
			n := len(victim.peerRegions)
			victim.peerMu.RUnlock()
			if n != 0 {
				t.Fatalf("victim mapped %d regions", n)
			}
			othersGoOn(t, attacker, ok1, ok2)
		})
	}
}
