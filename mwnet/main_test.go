package mwnet

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

// peerEnv names the target a re-executed test binary dials as a peer (killed_test.go).
const peerEnv = "MWNET_TEST_PEER"

func TestMain(m *testing.M) {
	if target := os.Getenv(peerEnv); target != "" {
		os.Exit(peerMain(target))
	}
	os.Exit(leakcheck.Main(m))
}

// peerMain dials target and writes to it until it is killed.
func peerMain(target string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	buf := make([]byte, 256<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			return 1
		}
	}
}
