package soft

import "golang.org/x/sys/windows"

// sendBuffer reads the socket fd's SO_SNDBUF.
func sendBuffer(fd uintptr) (int, error) {
	return windows.GetsockoptInt(windows.Handle(fd), windows.SOL_SOCKET, windows.SO_SNDBUF)
}
