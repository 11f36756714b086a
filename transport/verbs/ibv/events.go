//go:build ibverbs && linux && cgo

package ibv

import (
	"fmt"
	"os"
	"sync"
	"syscall"
)

// fdWatch runs a handler whenever a libibverbs event file descriptor (a completion
// channel or a context's asynchronous event fd) is readable, on one goroutine that waits in
// Go's network poller rather than in a blocking read. The descriptor is made non-blocking
// and watched through a duplicate, so that stop can close the duplicate (ending the wait)
// while libibverbs keeps the original.
type fdWatch struct {
	f    *os.File
	done chan struct{}
	once sync.Once
}

// watchFD starts the watcher. handle takes one event and reports whether another may be
// pending; it is called until it returns false, then the watcher waits for readability.
func watchFD(fd int, handle func() (more bool)) (*fdWatch, error) {
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("set fd %d non-blocking: %w", fd, err)
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("dup fd %d: %w", fd, err)
	}
	syscall.CloseOnExec(dup)
	f := os.NewFile(uintptr(dup), "ibv-events")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("watch fd %d: %w", fd, err)
	}
	w := &fdWatch{f: f, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			err := rc.Read(func(uintptr) bool {
				for handle() {
				}
				return false // wait for the next readiness
			})
			if err != nil {
				return // the duplicate was closed
			}
		}
	}()
	return w, nil
}

// stop ends the watcher and waits for its goroutine. The original descriptor stays open.
func (w *fdWatch) stop() {
	if w == nil {
		return
	}
	w.once.Do(func() { _ = w.f.Close() })
	<-w.done
}
