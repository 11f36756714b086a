package main

import "testing"

// TestRun runs the example as CI, so the README's example keeps working. The program
// exits the test binary with status 1 (log.Fatal) if any step does not go as described.
func TestRun(t *testing.T) { main() }
