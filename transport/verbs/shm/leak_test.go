package shm

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

// TestMain fails the tests if any leaves a goroutine behind.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
