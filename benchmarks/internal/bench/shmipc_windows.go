package bench

import (
	"errors"
	"fmt"
	"net"
)

// errNoShmipc is what the shmipc system says on Windows: shmipc-go v0.2.0 is built on Unix
// sockets with descriptor passing, memfd and mmap, and does not compile there.
var errNoShmipc = fmt.Errorf("shmipc-go is not on windows (it needs Unix sockets, memfd and mmap): %w", errors.ErrUnsupported)

// shmipcDesc describes shmipc-go in the echo matrix.
const shmipcDesc = "CloudWeGo shmipc-go v0.2.0 (Kitex's same-host IPC): not on Windows, where it does not build"

// shmipcStreamDesc describes shmipc-go in the streaming cell.
const shmipcStreamDesc = shmipcDesc

func serveShmipcEcho(net.Listener) (Server, error)  { return nil, errNoShmipc }
func dialShmipc(string, int, int) (Instance, error) { return nil, errNoShmipc }
func serveShmipcBulk(net.Listener) (Server, error)  { return nil, errNoShmipc }
func dialShmipcBulk(string) (StreamInstance, error) { return nil, errNoShmipc }
