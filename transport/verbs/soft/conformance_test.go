package soft_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
	"github.com/mwrpc/mwrpc/transport/verbs/verbstest"
)

// TestConformance runs the provider-independent conformance suite on both soft fabrics.
// The soft provider follows the IBTA everywhere the suite checks, so no case is marked
// divergent.
func TestConformance(t *testing.T) {
	var n atomic.Int64
	name := func() string { return fmt.Sprintf("soft%d", n.Add(1)) }

	fab := soft.NewFabric()
	verbstest.Run(t, verbstest.Fixture{
		Name: "inproc",
		Open: func(t testing.TB) verbs.Device {
			t.Helper()
			d, err := fab.Open(name())
			if err != nil {
				t.Fatalf("soft: open in-process device: %v", err)
			}
			return d
		},
	})
	verbstest.Run(t, verbstest.Fixture{
		Name: "tcp",
		Open: func(t testing.TB) verbs.Device {
			t.Helper()
			d, err := soft.OpenTCP(name())
			if err != nil {
				t.Fatalf("soft: open TCP device: %v", err)
			}
			return d
		},
	})
}
