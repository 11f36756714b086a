package main

import (
	"fmt"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mwrpc-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := leakcheck.Main(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
