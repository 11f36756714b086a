// Package load is the service the fault suite and the soak call (cmd/mwrpcload): an echo
// whose requests carry their own identity and an optional delay, and a method that reports
// the server's resource use, so that a driver can check that every response answers the
// call that asked for it and that nothing leaks once faults end.
package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
)

//go:generate go run github.com/mwrpc/mwrpc/cmd/mwrpcgen -type Load

// Load is the service.
type Load interface {
	// Echo returns its request after sleeping for the milliseconds in bytes 8-11 (see
	// Request).
	Echo(ctx context.Context, req []byte) ([]byte, error)
	// Stats reports the server's resource use.
	Stats(ctx context.Context, req *StatsRequest) (*Stats, error)
}

// StatsRequest asks for Stats.
type StatsRequest struct{}

// Stats is a process's resource use and its mwrpc server's counters.
type Stats struct {
	Goroutines     int
	RSSBytes       int64
	Conns          int
	WindowsExposed int   // windows bound now
	Grants         int   // grants to callers not yet used, revoked or reclaimed
	PoolInUse      int   // pooled buffers held
	PoolBytesInUse int64 // and their bytes
	Served         uint64
	Reclaimed      uint64
	// What a peer's connection holds of the process itself, for the soak to check after
	// its callers die (Linux; 0 elsewhere): open file descriptors, and mappings of memfds
	// (each pool slab is one, and over shm each ring and each peer region mapped is one).
	FDs       int
	MemfdMaps int
	PoolSlabs int // slabs of the server's pool: one memfd and one mapping each
}

// PeerFDs is what the process's descriptors are beyond its pool's slabs: the sockets,
// and over shm the rings, doorbells and peer regions of its connections.
func (s *Stats) PeerFDs() int { return s.FDs - s.PoolSlabs }

// PeerMaps is what the process's memfd mappings are beyond its pool's slabs: over shm,
// each connection's rings and the peer regions it has mapped.
func (s *Stats) PeerMaps() int { return s.MemfdMaps - s.PoolSlabs }

// RequestHeader is the length of the identity and delay at the front of every request.
const RequestHeader = 12

// Request fills b (at least RequestHeader bytes) as a request: id in bytes 0-7, the delay
// in bytes 8-11, and the rest a pattern derived from id, so that a response to another
// call cannot pass for this one's.
func Request(b []byte, id uint64, delay time.Duration) {
	binary.LittleEndian.PutUint64(b, id)
	binary.LittleEndian.PutUint32(b[8:], uint32(delay/time.Millisecond))
	for i := RequestHeader; i < len(b); i++ {
		b[i] = byte(id) + byte(i)
	}
}

// Server implements Load; Srv is the server whose counters Stats reports.
type Server struct {
	Srv *rpc.Server
}

// Echo returns req after its delay, or the context's error if that ends first.
func (s Server) Echo(ctx context.Context, req []byte) ([]byte, error) {
	if len(req) < RequestHeader {
		return nil, rpc.Errorf(rpc.InvalidArgument, "load: request of %d bytes, need %d", len(req), RequestHeader)
	}
	if d := time.Duration(binary.LittleEndian.Uint32(req[8:])) * time.Millisecond; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return req, nil
}

// Stats reports this process.
func (s Server) Stats(context.Context, *StatsRequest) (*Stats, error) {
	st := s.Srv.Stats()
	out := &Stats{Goroutines: runtime.NumGoroutine(), RSSBytes: RSS(), Conns: st.Conns,
		WindowsExposed: st.WindowsExposed, Grants: st.Grants, Served: st.Served, Reclaimed: st.Reclaimed}
	for _, c := range st.Pool.Classes {
		out.PoolInUse += c.InUse
		out.PoolBytesInUse += c.BytesInUse
		out.PoolSlabs += c.Slabs
	}
	if h, err := leakcheck.ReadHeld(); err == nil { // Linux: /proc
		out.FDs, out.MemfdMaps = h.FDs, h.Maps
	}
	return out, nil
}

// RSS returns this process's resident set size from /proc (0 where there is none).
func RSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// ErrMismatch is returned by Check for a response that is not its request's echo.
var ErrMismatch = errors.New("load: response does not answer its call")

// Check verifies that resp is the echo of req.
func Check(req, resp []byte) error {
	if string(resp) == string(req) {
		return nil
	}
	var got uint64
	if len(resp) >= 8 {
		got = binary.LittleEndian.Uint64(resp)
	}
	return fmt.Errorf("%w: call %d got %d bytes starting with call id %d (sent %d)",
		ErrMismatch, binary.LittleEndian.Uint64(req), len(resp), got, len(req))
}

// ParseSize reads one size: 64, 64B, 4K, 4KiB, 1M, 1MiB (case-insensitive; K and M are
// powers of 2).
func ParseSize(size string) (int, error) {
	t, mult := strings.ToLower(strings.TrimSpace(size)), 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"k", 1 << 10}, {"m", 1 << 20}, {"b", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.Atoi(t)
	if err != nil || n < 0 || n > (1<<31-1)/mult {
		return 0, fmt.Errorf("bad size %q", size)
	}
	return n * mult, nil
}

// ParseSizes reads a comma-separated list of sizes (see ParseSize), each positive.
func ParseSizes(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := ParseSize(f)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("bad size %q: must be positive", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty size list %q", list)
	}
	return out, nil
}
