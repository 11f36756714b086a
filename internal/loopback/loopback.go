// Package loopback tells a test whether a loopback address other than 127.0.0.1 is there
// to bind. Linux and Windows route all of 127.0.0.0/8 to the loopback interface; macOS and
// the BSDs configure 127.0.0.1 alone until an alias is added. It is for this module's tests
// only.
package loopback

import (
	"net"
	"runtime"
	"testing"
)

// Require skips t, saying why and how to add the address, unless ip can be bound here. On
// Linux, where every 127.x.y.z is there, a failure to bind fails t instead: something else
// is wrong.
func Require(t testing.TB, ip string) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err == nil {
		_ = ln.Close()
		return
	}
	if runtime.GOOS == "linux" {
		t.Fatalf("cannot bind %s on loopback: %v", ip, err)
	}
	t.Skipf("%s is not a loopback address of this machine (%v): macOS and the BSDs have 127.0.0.1 alone; add it with `sudo ifconfig lo0 alias %s up`", ip, err, ip)
}
