package main

import (
	"strings"
	"testing"
)

// TestRunBoth runs the example as `go run ./examples/kv` does, and checks what it says.
func TestRunBoth(t *testing.T) {
	var out strings.Builder
	if err := runBoth(&out, 200); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"put and got back a 1048576-byte value", "NotFound", "1 large responses fetched with RDMA READ", "1 revoked by the client's SEND_WITH_INV"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
