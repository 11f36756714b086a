package bench

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestBulkRequest(t *testing.T) {
	total, chunk, err := parseBulkRequest(bulkRequest(1<<30, 1<<20))
	if err != nil || total != 1<<30 || chunk != 1<<20 {
		t.Errorf("round trip: %d, %d, %v", total, chunk, err)
	}
	for _, b := range [][]byte{nil, make([]byte, 15), bulkRequest(1, 0), bulkRequest(1, 128<<20), bulkRequest(1<<41, 1)} {
		if _, _, err := parseBulkRequest(b); err == nil {
			t.Errorf("parseBulkRequest(%x): no error", b)
		}
	}
	if err := checkBulkReply("x", bulkReply(42), 42); err != nil {
		t.Error(err)
	}
	if err := checkBulkReply("x", bulkReply(41), 42); err == nil {
		t.Error("a short count passed")
	}
}

func TestCheckChunk(t *testing.T) {
	p := payload(1000)
	if err := checkChunk("x", p, 1000); err != nil {
		t.Error(err)
	}
	if err := checkChunk("x", p[:999], 1000); err == nil {
		t.Error("a short chunk passed")
	}
	q := payload(1000)
	q[999]++
	if err := checkChunk("x", q, 1000); err == nil {
		t.Error("a chunk with the wrong last byte passed")
	}
	if n := chunkLen(10, 8, 4); n != 2 {
		t.Errorf("chunkLen(10, 8, 4) = %d, want 2", n)
	}
}

func TestSummarizeStream(t *testing.T) {
	const gib = 1 << 30
	rounds := []StreamRound{
		{Bytes: gib, Elapsed: time.Second, CPU: time.Second, ServerCPU: 2 * time.Second, HasServerCPU: true, Mallocs: 1024},
		{Bytes: gib, Elapsed: 2 * time.Second, CPU: 3 * time.Second, ServerCPU: 1 * time.Second, HasServerCPU: true, Mallocs: 3072},
		{Bytes: gib, Elapsed: 4 * time.Second, CPU: 2 * time.Second, ServerCPU: 3 * time.Second, HasServerCPU: true, Mallocs: 2048},
	}
	r := summarizeStream("x", DirServerStream, 1<<20, rounds)
	if want := round3(gib / 2.0 / 1e6); r.MBPerSec != want {
		t.Errorf("MB/s %v, want %v (the median round's)", r.MBPerSec, want)
	}
	if r.ClientCPUSecPerGiB != 2 || r.ServerCPUSecPerGiB == nil || *r.ServerCPUSecPerGiB != 2 || r.ClientAllocsPerChunk != 2 {
		t.Errorf("cpu %v, server %v, allocs/chunk %v; want 2, 2, 2", r.ClientCPUSecPerGiB, r.ServerCPUSecPerGiB, r.ClientAllocsPerChunk)
	}
	if r.TotalBytes != gib || r.Rounds != 3 || len(r.RoundMBPerSec) != 3 {
		t.Errorf("%+v", r)
	}
	rounds[1].HasServerCPU = false
	if r := summarizeStream("x", DirClientStream, 1<<20, rounds); r.ServerCPUSecPerGiB != nil {
		t.Error("server CPU reported with a round that lacks it")
	}
}

// TestStreamSystemsInProcess runs every streaming system's server and client in this
// process, over loopback, both ways, with a chunk that does not divide the total, and the
// cell's runner in inproc mode on top.
func TestStreamSystemsInProcess(t *testing.T) {
	const total, chunk = 3<<20 + 5, 1 << 20
	cfg := Config{Systems: Systems, Mode: ModeInProcess}
	systems := cfg.StreamRunSystems()
	if len(systems) < 2 {
		t.Fatalf("%d systems stream, want at least rawtcp and grpc", len(systems))
	}
	for _, s := range systems {
		t.Run(s.Name, func(t *testing.T) {
			r, err := openStream(cfg, s)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := r.close(); err != nil {
					t.Error(err)
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for range 2 { // twice each: the connection serves one transfer after another
				if err := r.inst.Download(ctx, total, chunk); err != nil {
					t.Fatalf("download: %v", err)
				}
				if err := r.inst.Upload(ctx, total, chunk); err != nil {
					t.Fatalf("upload: %v", err)
				}
			}
		})
	}
	cfg.Rounds, cfg.StreamBytes, cfg.StreamChunk = 1, 2<<20, 256<<10
	res, err := RunStreams(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2*len(systems) {
		t.Fatalf("%d results, want %d", len(res), 2*len(systems))
	}
	for _, x := range res {
		if x.MBPerSec <= 0 || x.ServerCPUSecPerGiB != nil || x.TotalBytes != 2<<20 {
			t.Errorf("%s %s: %v MB/s, server CPU %v, %d bytes; want > 0, nil (inproc), 2 MiB", x.System, x.Direction, x.MBPerSec, x.ServerCPUSecPerGiB, x.TotalBytes)
		}
	}
	rep := &Report{Setup: Setup{Mode: ModeInProcess, StreamBytes: cfg.StreamBytes, StreamChunkBytes: cfg.StreamChunk, Rounds: 1}, StreamResults: res}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "## Streaming (inproc)") || !strings.Contains(md.String(), "| grpc | ") {
		t.Errorf("markdown:\n%s", md.String())
	}
}
