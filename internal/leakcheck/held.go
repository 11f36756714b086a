package leakcheck

import (
	"os"
	"strings"
	"testing"
	"time"
)

// Held is what a process holds that a connection of the shm fabric may leave behind: open
// descriptors (sockets, rings, doorbells, the memfds of regions) and memfd mappings (rings
// and regions, its own and its peers'). Both are counted, because a mapping outlives the
// descriptor it was made from. It is read from /proc: Linux only.
type Held struct{ FDs, Maps int }

// ReadHeld returns what this process holds now, or an error where /proc cannot say. The
// load harness's server reports it (benchmarks/internal/load) for its soak to check.
func ReadHeld() (Held, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return Held{}, err
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return Held{}, err
	}
	// Less the directory's own descriptor, open while it was read.
	return Held{FDs: len(ents) - 1, Maps: strings.Count(string(maps), " /memfd:")}, nil
}

// CountHeld returns what this process holds now; it fails t where /proc cannot say.
func CountHeld(t testing.TB) Held {
	t.Helper()
	h, err := ReadHeld()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// CheckHeld records what this process holds now and, at the test's cleanup, fails it if
// it holds more after 5 s (WaitHeld). Call it right after Check, so that its check runs
// after the test's own cleanups.
func CheckHeld(t testing.TB) {
	t.Helper()
	base := CountHeld(t)
	t.Cleanup(func() { WaitHeld(t, base) })
}

// WaitHeld fails t unless this process is back to base descriptors and memfd mappings
// within 5 s.
func WaitHeld(t testing.TB, base Held) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h := CountHeld(t); h.FDs > base.FDs || h.Maps > base.Maps; h = CountHeld(t) {
		if time.Now().After(deadline) {
			t.Errorf("%d descriptors and %d memfd mappings more than before the test (rings, doorbells, sockets or regions left open or mapped)",
				h.FDs-base.FDs, h.Maps-base.Maps)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
