package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"
)

// The streaming cell: bulk transfers in both directions, one stream at a time, per system.
//
//   - server stream ("download"): the client asks for StreamBytes in messages of
//     StreamChunk bytes; the server sends them; the client reads each and checks its
//     length and last byte (a cheap touch: no system pays for a memcmp).
//   - client stream ("upload"): the client sends StreamBytes in messages of StreamChunk
//     bytes; the server reads each, checks it the same way, and at the end answers once
//     with the count of bytes it read, which the client checks.
//
// Every message carries the same pattern (payload), so a chunk's last byte is known from
// its length alone.

// Directions of the streaming cell, as the results name them.
const (
	DirServerStream = "server-stream" // the server sends, the client reads
	DirClientStream = "client-stream" // the client sends, the server reads and answers once
)

// StreamInstance is a system's streaming client, connected to its bulk server. Download
// and Upload are called one at a time.
type StreamInstance interface {
	// Download asks the server for total bytes in messages of chunk bytes (the last
	// shorter if chunk does not divide total), reads them and checks each (see
	// checkChunk).
	Download(ctx context.Context, total int64, chunk int) error
	// Upload sends total bytes in messages of chunk bytes; the server checks each, and
	// answers with the count it read, which must be total.
	Upload(ctx context.Context, total int64, chunk int) error
	// Close closes the client (not the server).
	Close() error
}

// bulkRequestLen is the length of a download request: the total, then the chunk size,
// each a little-endian uint64.
const bulkRequestLen = 16

// bulkRequest encodes a download request.
func bulkRequest(total int64, chunk int) []byte {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, bulkRequestLen), uint64(total))
	return binary.LittleEndian.AppendUint64(b, uint64(chunk))
}

// maxStreamChunk bounds the chunk a bulk server accepts in a request.
const maxStreamChunk = 64 << 20

// parseBulkRequest decodes a download request.
func parseBulkRequest(b []byte) (total int64, chunk int, err error) {
	if len(b) != bulkRequestLen {
		return 0, 0, fmt.Errorf("bulk request of %d bytes, want %d", len(b), bulkRequestLen)
	}
	t, c := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	if t > 1<<40 || c == 0 || c > maxStreamChunk {
		return 0, 0, fmt.Errorf("bulk request for %d bytes in chunks of %d: out of range", t, c)
	}
	return int64(t), int(c), nil
}

// bulkReply encodes the answer to an upload: the bytes read, a little-endian uint64.
func bulkReply(n int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(n)) }

// checkBulkReply checks the answer to an upload of total bytes.
func checkBulkReply(system string, reply []byte, total int64) error {
	if len(reply) != 8 {
		return fmt.Errorf("%s: upload answered with %d bytes, want 8", system, len(reply))
	}
	if n := int64(binary.LittleEndian.Uint64(reply)); n != total {
		return fmt.Errorf("%s: server read %d bytes of an upload of %d", system, n, total)
	}
	return nil
}

// patternByte is payload's byte at offset i.
func patternByte(i int) byte { return byte(i*7 + 3) }

// checkChunk checks a received chunk: want bytes long, ending with the pattern's byte.
func checkChunk(system string, p []byte, want int) error {
	if len(p) != want {
		return fmt.Errorf("%s: stream message of %d bytes, want %d", system, len(p), want)
	}
	if want > 0 && p[want-1] != patternByte(want-1) {
		return fmt.Errorf("%s: stream message of %d bytes ends in %#x, want %#x", system, want, p[want-1], patternByte(want-1))
	}
	return nil
}

// chunkLen is the length of the message that starts at offset sent of a stream of total
// bytes in chunks of chunk.
func chunkLen(total, sent int64, chunk int) int { return int(min(int64(chunk), total-sent)) }

// StreamRound is one transfer of the streaming cell.
type StreamRound struct {
	Bytes        int64
	Elapsed      time.Duration
	CPU          time.Duration // this process's (the client's in two-process mode)
	ServerCPU    time.Duration // the server process's, in two-process mode on Linux
	HasServerCPU bool
	Mallocs      uint64 // this process's
	AllocBytes   uint64
}

// MBPerSec is the round's throughput in 10^6 bytes a second.
func (r StreamRound) MBPerSec() float64 { return float64(r.Bytes) / r.Elapsed.Seconds() / 1e6 }

// StreamResult is one system in one direction of the streaming cell: medians across
// rounds. It is one object of the "stream_results" array of latest.json.
type StreamResult struct {
	System     string `json:"system"`
	Direction  string `json:"direction"` // DirServerStream or DirClientStream
	TotalBytes int64  `json:"total_bytes"`
	ChunkBytes int    `json:"chunk_bytes"`
	// MBPerSec is payload bytes over the transfer's wall time (from the client's first
	// call until it has the last byte, or the server's answer), 10^6 bytes a second.
	MBPerSec float64 `json:"mb_per_sec"`
	// ClientCPUSecPerGiB is getrusage(RUSAGE_SELF) user+system time over the transfer, per
	// GiB moved: the client's alone in two-process mode, both sides in inproc mode.
	ClientCPUSecPerGiB float64 `json:"client_cpu_s_per_gib"`
	// ServerCPUSecPerGiB is the server process's user+system time (/proc/PID/stat, 10 ms
	// ticks) over the transfer, per GiB; null in inproc mode.
	ServerCPUSecPerGiB *float64 `json:"server_cpu_s_per_gib"`
	// ClientAllocsPerChunk and ClientAllocBytesPerChunk are runtime.MemStats Mallocs and
	// TotalAlloc deltas in the harness's process over the transfer, per message.
	ClientAllocsPerChunk     float64 `json:"client_allocs_per_chunk"`
	ClientAllocBytesPerChunk float64 `json:"client_alloc_bytes_per_chunk"`
	Rounds                   int     `json:"rounds"`
	// The per-round figures behind the medians.
	RoundMBPerSec  []float64 `json:"round_mb_per_sec"`
	RoundSeconds   []float64 `json:"round_seconds"`
	RoundClientCPU []float64 `json:"round_client_cpu_s"`
	RoundServerCPU []float64 `json:"round_server_cpu_s,omitempty"`
}

// summarizeStream reduces a system's rounds in one direction to their medians.
func summarizeStream(system, dir string, chunk int, rounds []StreamRound) StreamResult {
	res := StreamResult{System: system, Direction: dir, ChunkBytes: chunk, Rounds: len(rounds)}
	var mbps, cpu, scpu, allocs, allocBytes []float64
	for _, r := range rounds {
		res.TotalBytes = r.Bytes
		gib := float64(r.Bytes) / (1 << 30)
		chunks := float64((r.Bytes + int64(chunk) - 1) / int64(chunk))
		res.RoundMBPerSec = append(res.RoundMBPerSec, round3(r.MBPerSec()))
		res.RoundSeconds = append(res.RoundSeconds, round3(r.Elapsed.Seconds()))
		res.RoundClientCPU = append(res.RoundClientCPU, round3(r.CPU.Seconds()))
		mbps = append(mbps, r.MBPerSec())
		cpu = append(cpu, r.CPU.Seconds()/gib)
		allocs = append(allocs, float64(r.Mallocs)/chunks)
		allocBytes = append(allocBytes, float64(r.AllocBytes)/chunks)
		if r.HasServerCPU {
			res.RoundServerCPU = append(res.RoundServerCPU, round3(r.ServerCPU.Seconds()))
			scpu = append(scpu, r.ServerCPU.Seconds()/gib)
		}
	}
	res.MBPerSec = round3(Median(mbps))
	res.ClientCPUSecPerGiB = round3(Median(cpu))
	res.ClientAllocsPerChunk = round3(Median(allocs))
	res.ClientAllocBytesPerChunk = round3(Median(allocBytes))
	if len(rounds) > 0 && len(scpu) == len(rounds) {
		c := round3(Median(scpu))
		res.ServerCPUSecPerGiB = &c
	}
	return res
}

// StreamRunSystems returns the systems of cfg in the streaming cell.
func (cfg *Config) StreamRunSystems() []System {
	var out []System
	for _, s := range cfg.Systems {
		if s.Streams() {
			out = append(out, s)
		}
	}
	return out
}

// streamWarmupBytes caps the warm-up transfer of each system, each way.
const streamWarmupBytes = 64 << 20

// streamTimeout bounds one transfer of total bytes: 30 s, plus a second per 20 MB.
func streamTimeout(total int64) time.Duration {
	return 30*time.Second + time.Duration(total/20e6)*time.Second
}

// streamRunner is one system set up for the streaming cell.
type streamRunner struct {
	sys  System
	inst StreamInstance
	srv  Server      // the server in this process (ModeInProcess)
	proc *serverProc // the server process (ModeTwoProcess)
}

func (r *streamRunner) close() error {
	err := r.inst.Close()
	if r.srv != nil {
		err = errors.Join(err, r.srv.Close())
	}
	if r.proc != nil {
		err = errors.Join(err, r.proc.stop())
	}
	return err
}

// openStream sets s's bulk server up (a process of its own in ModeTwoProcess, a
// loopback listener in this process in ModeInProcess) and dials it.
func openStream(cfg Config, s System) (*streamRunner, error) {
	r := &streamRunner{sys: s}
	var addr string
	if cfg.Mode == ModeInProcess {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen: %w", err)
		}
		if r.srv, err = s.ServeStream(ln); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("serve: %w", err)
		}
		addr = ln.Addr().String()
	} else {
		p, err := startServer(cfg.Executable, s.Name, CellStream, serverProfile(cfg, s.Name, CellStream, Cell{}))
		if err != nil {
			return nil, err
		}
		r.proc, addr = p, p.addr
	}
	inst, err := s.DialStream(addr)
	if err != nil {
		err = fmt.Errorf("dial %s: %w", addr, err)
		if r.srv != nil {
			return nil, errors.Join(err, r.srv.Close())
		}
		return nil, errors.Join(err, r.proc.stop())
	}
	r.inst = inst
	return r, nil
}

// transfer runs one transfer of total bytes in dir and reads the counters around it.
func (r *streamRunner) transfer(dir string, total int64, chunk int) (StreamRound, error) {
	ctx, cancel := context.WithTimeout(context.Background(), streamTimeout(total))
	defer cancel()
	do := r.inst.Download
	if dir == DirClientStream {
		do = r.inst.Upload
	}
	runtime.GC()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := selfCPU()
	var scpu0, scpu1 time.Duration
	var ok0, ok1 bool
	if r.proc != nil {
		scpu0, ok0 = r.proc.cpu()
	}
	t0 := time.Now()
	err := do(ctx, total, chunk)
	elapsed := time.Since(t0)
	cpu1 := selfCPU()
	if r.proc != nil {
		scpu1, ok1 = r.proc.cpu()
	}
	runtime.ReadMemStats(&ms1)
	if err != nil {
		return StreamRound{}, fmt.Errorf("%s of %s: %w", dir, SizeName64(total), err)
	}
	res := StreamRound{
		Bytes:      total,
		Elapsed:    elapsed,
		CPU:        cpu1 - cpu0,
		Mallocs:    ms1.Mallocs - ms0.Mallocs,
		AllocBytes: ms1.TotalAlloc - ms0.TotalAlloc,
	}
	if ok0 && ok1 {
		res.ServerCPU, res.HasServerCPU = scpu1-scpu0, true
	}
	return res, nil
}

// RunStreams runs the streaming cell: every system of cfg that streams is set up (its
// bulk server in a process of its own in ModeTwoProcess), warmed up, then measured Rounds
// times in each direction, the systems interleaved and their order rotated every round
// as in Run. It returns one result per system and direction, medians across rounds.
func RunStreams(cfg Config) ([]StreamResult, error) {
	systems := cfg.StreamRunSystems()
	if cfg.Rounds < 1 || cfg.StreamBytes <= 0 || cfg.StreamChunk <= 0 || cfg.StreamChunk > maxStreamChunk || len(systems) == 0 {
		return nil, errors.New("bench: the streaming cell needs a system that streams, one round, and a positive size and chunk (at most 64 MiB)")
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeTwoProcess
	}
	if cfg.Mode == ModeTwoProcess && cfg.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("bench: the server processes' executable: %w", err)
		}
		cfg.Executable = exe
	}
	prog := cfg.Progress
	if prog == nil {
		prog = nopProgress{}
	}
	dirs := []string{DirServerStream, DirClientStream}
	prog.Start(len(systems) * cfg.Rounds * len(dirs))
	defer prog.Finish()

	runners := make([]*streamRunner, len(systems))
	defer func() {
		for _, r := range runners {
			if r != nil {
				_ = r.close()
			}
		}
	}()
	for i, s := range systems {
		r, err := openStream(cfg, s)
		if err != nil {
			return nil, fmt.Errorf("stream: %s: setup: %w", s.Name, err)
		}
		runners[i] = r
	}
	if cfg.Warmup > 0 {
		if err := warmStreams(cfg, runners, dirs, prog); err != nil {
			return nil, err
		}
	}
	rounds, err := measureStreams(cfg, runners, dirs, prog)
	if err != nil {
		return nil, err
	}
	for i, r := range runners {
		runners[i] = nil
		if err := r.close(); err != nil {
			return nil, fmt.Errorf("stream: %s: teardown: %w", r.sys.Name, err)
		}
	}
	var out []StreamResult
	for i, s := range systems {
		for d, dir := range dirs {
			out = append(out, summarizeStream(s.Name, dir, cfg.StreamChunk, rounds[i][d]))
		}
	}
	return out, nil
}

// warmStreams moves a short transfer (streamWarmupBytes at most) each way through every
// runner, unmeasured.
func warmStreams(cfg Config, runners []*streamRunner, dirs []string, prog Progress) error {
	for _, r := range runners {
		prog.StreamBegin(r.sys.Name, "warm-up", -1)
		for _, dir := range dirs {
			if _, err := r.transfer(dir, min(cfg.StreamBytes, streamWarmupBytes), cfg.StreamChunk); err != nil {
				return fmt.Errorf("stream: %s: warm-up: %w", r.sys.Name, err)
			}
		}
	}
	return nil
}

// measureStreams runs cfg.Rounds rounds of every runner in each direction, the runners'
// order rotated every round; it returns the rounds by runner, then direction.
func measureStreams(cfg Config, runners []*streamRunner, dirs []string, prog Progress) ([][][]StreamRound, error) {
	rounds := make([][][]StreamRound, len(runners))
	for i := range rounds {
		rounds[i] = make([][]StreamRound, len(dirs))
	}
	for round := range cfg.Rounds {
		for k := range runners {
			i := (k + round) % len(runners)
			r := runners[i]
			for d, dir := range dirs {
				prog.StreamBegin(r.sys.Name, dir, round)
				res, err := r.transfer(dir, cfg.StreamBytes, cfg.StreamChunk)
				if err != nil {
					return nil, fmt.Errorf("stream: %s: round %d: %w", r.sys.Name, round+1, err)
				}
				rounds[i][d] = append(rounds[i][d], res)
				prog.StreamEnd(r.sys.Name, dir, round, res)
			}
		}
	}
	return rounds, nil
}

// SizeName64 is SizeName for sizes that may pass 2 GiB, and that names GiB: 1 GiB.
func SizeName64(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	if n > 1<<31-1 {
		return fmt.Sprintf("%d B", n)
	}
	return SizeName(int(n))
}
