package mwnet

import (
	"os"
	"testing"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
