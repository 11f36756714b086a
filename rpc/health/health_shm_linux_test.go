package health_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/health"
)

// TestSHM: over the shm fabric, a client with WithHealthCheck connects to a serving server,
// Check answers, and a Watch sees the server stop serving.
func TestSHM(t *testing.T) {
	leakcheck.Check(t)
	s := startServer(t, "a", "shm://"+filepath.Join(t.TempDir(), "h.sock"), true)
	c := dial(t, s.addr, rpc.WithHealthCheck(""))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if name, err := who(ctx, c); err != nil || name != "a" {
		t.Fatalf("who: %q %v", name, err)
	}
	hc := health.NewHealthClient(c)
	resp, err := hc.Check(ctx, &health.CheckRequest{})
	if err != nil || resp.Status != health.Serving {
		t.Fatalf("Check: %v %v", resp, err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	ch, _ := watch(wctx, hc, "")
	if st := next(t, ch, 5*time.Second); st != health.Serving {
		t.Fatalf("watch: %v first", st)
	}
	s.hs.Shutdown()
	if st := next(t, ch, 5*time.Second); st != health.NotServing {
		t.Fatalf("watch: %v after Shutdown", st)
	}
	wcancel()
	for range ch {
	}
}
