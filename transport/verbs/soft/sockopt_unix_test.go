//go:build unix

package soft

import "syscall"

// sendBuffer reads the socket fd's SO_SNDBUF.
func sendBuffer(fd uintptr) (int, error) {
	return syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
}
