package transport

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/shm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// On Linux the end-to-end tests that range over fabrics also run over the shm fabric:
// soft devices whose queue pairs are connected by shared-memory rings, set up through a
// Unix socket in the test's temporary directory (dialed as shm:///path). Tests that pick
// fabrics[0] or fabrics[1] are unaffected: "shm" is appended after them.
func init() {
	fabrics = append(fabrics, fabric{"shm", func(t testing.TB) (verbs.Device, verbs.Device) {
		a, _ := soft.OpenTCP("client")
		b, _ := soft.OpenTCP("server")
		return a, b
	}})
	fabricListeners["shm"] = func(t testing.TB) (net.Listener, string) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "mwrpc.sock")
		ln, err := shm.Listen(path, shm.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return ln, shm.Scheme + path
	}
}
