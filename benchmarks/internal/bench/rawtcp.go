package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// rawTCPInstance is the floor: a length-prefixed echo over loopback TCP with nothing on
// top, one connection per worker (a ping-pong protocol cannot share one).
type rawTCPInstance struct {
	ln    net.Listener
	conns sync.WaitGroup
	cli   []net.Conn
	in    [][]byte // per worker
	msg   []byte   // 4-byte length, then the payload
}

func openRawTCP(size, concurrency int) (Instance, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &rawTCPInstance{ln: ln}
	r.msg = binary.LittleEndian.AppendUint32(make([]byte, 0, 4+size), uint32(size))
	r.msg = append(r.msg, payload(size)...)
	r.conns.Add(1)
	go func() {
		defer r.conns.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.conns.Add(1)
			go func() {
				defer r.conns.Done()
				rawTCPServe(c, size)
			}()
		}
	}()
	for range concurrency {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			_ = r.Close()
			return nil, err
		}
		r.cli = append(r.cli, c)
		r.in = append(r.in, make([]byte, len(r.msg)))
	}
	return r, nil
}

// rawTCPServe echoes length-prefixed messages of at most max bytes until the peer closes.
func rawTCPServe(c net.Conn, max int) {
	defer c.Close()
	buf := make([]byte, 4+max)
	for {
		if _, err := io.ReadFull(c, buf[:4]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(buf))
		if n > max {
			return
		}
		if _, err := io.ReadFull(c, buf[4:4+n]); err != nil {
			return
		}
		if _, err := c.Write(buf[:4+n]); err != nil {
			return
		}
	}
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
	err = errors.Join(err, r.ln.Close())
	r.conns.Wait()
	return err
}
