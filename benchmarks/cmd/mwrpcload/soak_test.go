package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/benchmarks/internal/load"
)

// TestSoakFinish: the soak's end checks, each held against the start, fail on what a dead
// caller could leave behind in the server, and pass on a server back where it began.
func TestSoakFinish(t *testing.T) {
	start := load.Stats{Goroutines: 11, RSSBytes: 10 << 20, Conns: 1, PoolInUse: 256, FDs: 60, MemfdMaps: 52, PoolSlabs: 50}
	for _, tc := range []struct {
		name string
		end  func(*load.Stats)
		want string // in the one problem; "" for none
	}{
		{"back where it began", func(*load.Stats) {}, ""},
		{"the pool grew a slab", func(s *load.Stats) { s.FDs++; s.MemfdMaps++; s.PoolSlabs++ }, ""},
		{"a window bound", func(s *load.Stats) { s.WindowsExposed = 1 }, "windows still bound"},
		{"a grant given", func(s *load.Stats) { s.Grants = 1 }, "grants still given"},
		{"a pooled buffer held", func(s *load.Stats) { s.PoolInUse++ }, "pooled buffers held"},
		{"a descriptor open", func(s *load.Stats) { s.FDs++ }, "descriptors and"},
		{"a region mapped", func(s *load.Stats) { s.MemfdMaps++ }, "memfd mappings beyond the pool"},
		{"goroutines", func(s *load.Stats) { s.Goroutines += 3 }, "goroutines"},
		{"RSS", func(s *load.Stats) { s.RSSBytes = 12 << 20 }, "RSS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end := start
			tc.end(&end)
			r := &soakRun{res: SoakResult{RSSWarm: 10 << 20}}
			r.finish(time.Now(), &start, &end)
			switch p := r.res.Problems; {
			case tc.want == "" && len(p) != 0:
				t.Errorf("problems %q, want none", p)
			case tc.want != "" && (len(p) != 1 || !strings.Contains(p[0], tc.want)):
				t.Errorf("problems %q, want one saying %q", p, tc.want)
			}
		})
	}
}

// TestSoakListen: each fabric's listen address, and a clear error for another.
func TestSoakListen(t *testing.T) {
	if got, err := soakListen("tcp"); err != nil || got != "127.0.0.1:0" {
		t.Errorf("tcp: %q, %v", got, err)
	}
	got, err := soakListen("shm")
	if runtime.GOOS == "linux" && (err != nil || !strings.HasPrefix(got, "shm:///")) {
		t.Errorf("shm: %q, %v; want an shm:/// target", got, err)
	}
	if runtime.GOOS != "linux" && err == nil {
		t.Errorf("shm off Linux: %q, no error", got)
	}
	if _, err := soakListen("rdma"); err == nil || !strings.Contains(err.Error(), `"rdma"`) {
		t.Errorf("an unknown fabric: %v, want an error naming it", err)
	}
}

// TestCheckClient: a fault row fails on what the caller's summary shows wrong, the
// caller's Close and Release included.
func TestCheckClient(t *testing.T) {
	ok := Summary{Calls: 10, OK: 10, DeadlineMs: 2000, RecoverMs: -1}
	for _, tc := range []struct {
		name string
		sum  func(*Summary)
		want string
	}{
		{"clean", func(*Summary) {}, ""},
		{"hung", func(s *Summary) { s.Hung = 1 }, "hung"},
		{"wrong call", func(s *Summary) { s.Mismatched = 1 }, "wrong call"},
		{"a window kept", func(s *Summary) { s.WindowsExposedAfter = 1 }, "windows bound"},
		{"Close reports a leak", func(s *Summary) { s.CloseError = "pool: 1 buffer outstanding" }, "Close: pool: 1 buffer"},
		{"Release refused", func(s *Summary) { s.ReleaseFailed = 2 }, "2 lent responses refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum := ok
			tc.sum(&sum)
			b, err := json.Marshal(sum)
			if err != nil {
				t.Fatal(err)
			}
			fr := &faultRun{row: &Row{}}
			if !fr.checkClient(bytes.NewBuffer(b), fault{name: "none"}, time.Second) {
				t.Fatal("checkClient did not read the summary")
			}
			switch p := fr.row.Problems; {
			case tc.want == "" && len(p) != 0:
				t.Errorf("problems %q, want none", p)
			case tc.want != "" && (len(p) != 1 || !strings.Contains(p[0], tc.want)):
				t.Errorf("problems %q, want one saying %q", p, tc.want)
			}
		})
	}
}
