package leakcheck

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
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
	runtimeFDs.Do(openRuntimeFDs)
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

var runtimeFDs sync.Once

// openRuntimeFDs has the runtime open the descriptors it keeps for the life of the
// process, before anything is counted: its network poller's epoll and eventfd, made at
// the first pollable descriptor or timer. A test that counted first and then slept saw
// them as 2 descriptors it left open.
func openRuntimeFDs() {
	if r, w, err := os.Pipe(); err == nil { // a pipe is pollable: the poller starts
		_ = r.Close()
		_ = w.Close()
	}
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
			t.Errorf("%d descriptors and %d memfd mappings more than before the test (rings, doorbells, sockets or regions left open or mapped); open now: %s",
				h.FDs-base.FDs, h.Maps-base.Maps, openKinds())
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openKinds says what this process's descriptors are, by kind (what /proc/self/fd links
// to, the inode numbers left out), for WaitHeld's error: "socket 4, anon_inode:[eventfd] 2".
func openKinds() string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err.Error()
	}
	count := map[string]int{}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the directory's own descriptor, closed by now
		}
		if i := strings.IndexByte(target, ':'); i > 0 && strings.HasSuffix(target, "]") && !strings.HasPrefix(target, "anon_inode") {
			target = target[:i] // socket:[1234] -> socket
		}
		count[target]++
	}
	kinds := make([]string, 0, len(count))
	for k, n := range count {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	return strings.Join(kinds, ", ")
}
