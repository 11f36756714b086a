//go:build !linux

package shm

import (
	"context"
	"fmt"
	"net"
	"time"
)

// Conn is an shm connection. Outside Linux none can be made: Dial fails with
// ErrUnsupported.
type Conn struct{}

// Dial fails with ErrUnsupported: the shm fabric needs Linux (memfd, SO_PEERCRED, eventfd).
func Dial(ctx context.Context, path string, cfg Config) (*Conn, error) {
	return nil, fmt.Errorf("shm: dial %s: %w", path, ErrUnsupported)
}

// Listener is an shm listener. Outside Linux none can be made: Listen fails with
// ErrUnsupported.
type Listener struct{}

// Listen fails with ErrUnsupported: the shm fabric needs Linux.
func Listen(path string, cfg Config) (*Listener, error) {
	return nil, fmt.Errorf("shm: listen %s: %w", path, ErrUnsupported)
}

// Accept fails with ErrUnsupported.
func (l *Listener) Accept() (net.Conn, error) { return nil, ErrUnsupported }

// Close does nothing.
func (l *Listener) Close() error { return nil }

// Addr returns an empty shm address.
func (l *Listener) Addr() net.Addr { return &Addr{} }

// Refused returns 0.
func (l *Listener) Refused() int64 { return 0 }

// Read fails with ErrUnsupported.
func (c *Conn) Read(p []byte) (int, error) { return 0, ErrUnsupported }

// Write fails with ErrUnsupported.
func (c *Conn) Write(p []byte) (int, error) { return 0, ErrUnsupported }

// Close does nothing.
func (c *Conn) Close() error { return nil }

// LocalAddr returns an empty shm address.
func (c *Conn) LocalAddr() net.Addr { return &Addr{} }

// RemoteAddr returns an empty shm address.
func (c *Conn) RemoteAddr() net.Addr { return &Addr{} }

// SetDeadline fails with ErrUnsupported.
func (c *Conn) SetDeadline(t time.Time) error { return ErrUnsupported }

// SetReadDeadline fails with ErrUnsupported.
func (c *Conn) SetReadDeadline(t time.Time) error { return ErrUnsupported }

// SetWriteDeadline fails with ErrUnsupported.
func (c *Conn) SetWriteDeadline(t time.Time) error { return ErrUnsupported }

// Stats returns zero counts: there is no connection here.
func (c *Conn) Stats() Stats { return Stats{} }
