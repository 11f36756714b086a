package main

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

// TestMain fails the example's test if it leaves a goroutine behind: the server, the
// client and the SDK's exporters all stop when run returns.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
