package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mwrpc/mwrpc/benchmarks/internal/bench"
)

const perftestTxt = `ib_send_lat 64 1000 12.12 175.21 12.00 13.79 9.44 39.54 175.21
ib_send_lat 64 1000 12.12 175.21 14.00 13.79 9.44 41.00 175.21
ib_send_lat 64 1000 12.12 175.21 13.00 13.79 9.44 40.00 175.21
ib_read_lat 65536 1000 1395.55 2947.67 1000.00 1671.51 244.92 2846.36 2947.67
ib_read_lat 65536 1000 inf inf inf inf -nan inf inf
`

func TestParsePerftestAndFloors(t *testing.T) {
	pts, dropped, err := parsePerftest(strings.NewReader(perftestTxt))
	if err != nil {
		t.Fatal(err)
	}
	if dropped != 1 {
		t.Errorf("dropped %d runs, want 1 (inf)", dropped)
	}
	if len(pts) != 2 || pts[0].Tool != "ib_read_lat" || pts[0].Runs != 1 || pts[1].Runs != 3 || pts[1].TypicalUs != 13 || pts[1].P99Us != 40 {
		t.Fatalf("parsed %+v", pts)
	}
	if f, ok := floor(pts, 64); !ok || f.Us != 26 {
		t.Errorf("64 B floor %+v %v, want 26 us (2 x 13)", f, ok)
	}
	if f, ok := floor(pts, 64<<10); !ok || f.Us != 2026 {
		t.Errorf("64 KiB floor %+v %v, want 2026 us (2 x 13 + 2 x 1000)", f, ok)
	}
	if _, ok := floor(pts, 4<<10); ok {
		t.Error("4 KiB floor without ib_send_lat at 4 KiB")
	}
	if _, _, err := parsePerftest(strings.NewReader("ib_send_lat 64 x\n")); err == nil {
		t.Error("a short line parsed")
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	rep := bench.Report{
		Setup: bench.Setup{Command: "mwrpcbench", Payloads: []int{64}, Systems: []bench.SystemInfo{{Name: "mwrpc-ibv"}, {Name: "rawtcp"}}},
		Results: []bench.Result{
			{System: "rawtcp", PayloadBytes: 64, Concurrency: 1, P50Ns: 20000, P99Ns: 40000, OpsPerSec: 1000},
			{System: "mwrpc-ibv", PayloadBytes: 64, Concurrency: 1, P50Ns: 52000, P99Ns: 90000, OpsPerSec: 500, Ops: 750},
		},
	}
	if err := rep.WriteJSON(filepath.Join(dir, "latest.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "perftest.txt"), []byte(perftestTxt), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run(dir, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| 64 B | 1 | mwrpc-ibv | 52.0 | 90.0 | 500 | 750 | 2.60x | 0.50x | 2.00x |") {
		t.Errorf("markdown:\n%s", out.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "rxe.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if len(s.Rows) != 2 || s.Rows[0].System != "mwrpc-ibv" || s.Rows[0].P50VsFloor != 2 {
		t.Errorf("rxe.json rows %+v", s.Rows)
	}
}
