package pool

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

// TestMain fails the package's tests if any of them leaves a goroutine behind.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
