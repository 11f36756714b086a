package load

import (
	"context"
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestStatsCountsPeerHoldings: Stats counts each descriptor and each memfd mapping the
// process opens (what a peer's connection would hold over shm), and their end.
func TestStatsCountsPeerHoldings(t *testing.T) {
	srv := rpc.NewServer()
	defer srv.Stop()
	stats := func() *Stats {
		t.Helper()
		st, err := (Server{Srv: srv}).Stats(context.Background(), &StatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	before := stats()
	if before.FDs == 0 || before.PeerFDs() != before.FDs || before.PoolSlabs != 0 {
		t.Fatalf("before: %d descriptors, %d beyond the pool's %d slabs", before.FDs, before.PeerFDs(), before.PoolSlabs)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	m, err := verbs.Map(1<<16, verbs.MapOptions{Shared: true}) // a memfd, open and mapped
	if err != nil {
		t.Fatal(err)
	}
	if m.SharedFile() < 0 {
		t.Fatal("verbs.Map(Shared) made no memfd on Linux")
	}
	held := stats()
	if held.PeerFDs() != before.PeerFDs()+2 || held.PeerMaps() != before.PeerMaps()+1 {
		t.Errorf("a file and a mapped memfd open: descriptors %d -> %d, memfd mappings %d -> %d; want +2 and +1",
			before.PeerFDs(), held.PeerFDs(), before.PeerMaps(), held.PeerMaps())
	}
	if err := m.Unmap(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if after := stats(); after.PeerFDs() != before.PeerFDs() || after.PeerMaps() != before.PeerMaps() {
		t.Errorf("both closed: descriptors %d, memfd mappings %d; want %d and %d as before",
			after.PeerFDs(), after.PeerMaps(), before.PeerFDs(), before.PeerMaps())
	}
}
