package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// rawTCPMax is the largest message the raw TCP server accepts: above the largest payload.
const rawTCPMax = 64 << 20

// rawTCPServer is the floor's server: one goroutine per connection, serving a
// length-prefixed echo (serveRawTCP) or bulk transfers (serveRawTCPBulk).
type rawTCPServer struct {
	ln    net.Listener
	conns sync.WaitGroup
	mu    sync.Mutex
	open  map[net.Conn]bool
}

func serveRawTCP(ln net.Listener) (Server, error) { return serveRawConns(ln, rawTCPServe), nil }

// serveRawConns serves every connection accepted on ln with serve, on a goroutine of its
// own; serve closes the connection.
func serveRawConns(ln net.Listener, serve func(net.Conn)) *rawTCPServer {
	r := &rawTCPServer{ln: ln, open: map[net.Conn]bool{}}
	r.conns.Add(1)
	go func() {
		defer r.conns.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.track(c, true)
			r.conns.Add(1)
			go func() {
				defer r.conns.Done()
				defer r.track(c, false)
				serve(c)
			}()
		}
	}()
	return r
}

func (r *rawTCPServer) track(c net.Conn, open bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if open {
		r.open[c] = true
	} else {
		delete(r.open, c)
	}
}

func (r *rawTCPServer) Copied() (uint64, bool) { return 0, false }

// Close closes the listener and every connection still open, and waits for their
// goroutines.
func (r *rawTCPServer) Close() error {
	err := r.ln.Close()
	r.mu.Lock()
	for c := range r.open {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.conns.Wait()
	return err
}

// rawTCPServe echoes length-prefixed messages of at most rawTCPMax bytes until the peer
// closes; its buffer grows to the largest message seen.
func rawTCPServe(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 4+64)
	for {
		if _, err := io.ReadFull(c, buf[:4]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(buf))
		if n > rawTCPMax {
			return
		}
		if 4+n > len(buf) {
			buf = append(buf[:4], make([]byte, n)...)
		}
		if _, err := io.ReadFull(c, buf[4:4+n]); err != nil {
			return
		}
		if _, err := c.Write(buf[:4+n]); err != nil {
			return
		}
	}
}

// rawTCPInstance is the floor's client: one connection per worker (a ping-pong protocol
// cannot share one).
type rawTCPInstance struct {
	cli []net.Conn
	in  [][]byte // per worker
	msg []byte   // 4-byte length, then the payload
}

func dialRawTCP(addr string, size, concurrency int) (Instance, error) {
	r := &rawTCPInstance{}
	r.msg = binary.LittleEndian.AppendUint32(make([]byte, 0, 4+size), uint32(size))
	r.msg = append(r.msg, payload(size)...)
	for range concurrency {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("dial: %w", err), r.Close())
		}
		r.cli = append(r.cli, c)
		r.in = append(r.in, make([]byte, len(r.msg)))
	}
	return r, nil
}

func (r *rawTCPInstance) Call(w int) error {
	c, in := r.cli[w], r.in[w]
	if _, err := c.Write(r.msg); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, in); err != nil {
		return err
	}
	if n := binary.LittleEndian.Uint32(in); int(n) != len(r.msg)-4 {
		return fmt.Errorf("rawtcp: response of %d bytes to a request of %d", n, len(r.msg)-4)
	}
	return nil
}

func (r *rawTCPInstance) Copied() (uint64, bool) { return 0, false }

func (r *rawTCPInstance) Close() error {
	var err error
	for _, c := range r.cli {
		err = errors.Join(err, c.Close())
	}
	return err
}
