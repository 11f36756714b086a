//go:build !windows

package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/cloudwego/shmipc-go"
)

// shmipcDesc describes shmipc-go in the echo matrix.
const shmipcDesc = "CloudWeGo shmipc-go v0.2.0 (Kitex's same-host IPC), its own Server and SessionManager over a Unix socket, memfd shared memory of 128 MiB a side (the default 32 MiB sends what does not fit through the socket and then refuses new streams for 30 s), one session, a stream per caller, length-prefixed echo read with ReadBytes (no copy) and written with WriteBytes (same host only)"

// shmipcStreamDesc describes shmipc-go in the streaming cell.
const shmipcStreamDesc = "shmipc-go (as in the echo matrix): one stream for all transfers, each message length-prefixed and flushed"

// shmipcConfig is the session configuration both sides use: the library's defaults, with
// memfd memory (no files left in /dev/shm), 128 MiB of it (what the harness keeps in
// flight at most: -max-inflight), and its log discarded.
func shmipcConfig() *shmipc.Config {
	shmipcQuiet.Do(func() { shmipc.SetLogLevel(shmipcLevelError) })
	c := shmipc.DefaultConfig()
	c.MemMapType = shmipc.MemMapTypeMemFd
	c.ShareMemoryBufferCap = 128 << 20
	c.LogOutput = io.Discard
	return c
}

// shmipcLevelError is shmipc-go's error log level: its warnings (a buffer manager cleaned
// up at each session's end) are left out of the harness's output.
const shmipcLevelError = 4

var shmipcQuiet sync.Once

// shmipcServer accepts sessions on a Unix socket and runs handle on each stream.
type shmipcServer struct {
	tcp net.Listener
	ln  *net.UnixListener
	wg  sync.WaitGroup

	mu       sync.Mutex
	sessions map[*shmipc.Session]struct{}
}

func serveShmipc(ln net.Listener, handle func(*shmipc.Stream)) (Server, error) {
	path, err := sameHostSocket("shmipc", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	_ = os.Remove(path) // left by a server process that was killed
	uln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("shmipc: listen %s: %w", path, err)
	}
	s := &shmipcServer{tcp: ln, ln: uln, sessions: map[*shmipc.Session]struct{}{}}
	s.wg.Add(1)
	go s.accept(handle)
	return s, nil
}

func (s *shmipcServer) accept(handle func(*shmipc.Stream)) {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		sess, err := shmipc.Server(conn, shmipcConfig())
		if err != nil {
			_ = conn.Close()
			continue
		}
		s.mu.Lock()
		s.sessions[sess] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				st, err := sess.AcceptStream()
				if err != nil {
					return
				}
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					defer st.Close()
					handle(st)
				}()
			}
		}()
	}
}

func (s *shmipcServer) Copied() (uint64, bool) { return 0, false }

func (s *shmipcServer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for sess := range s.sessions {
		_ = sess.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(err, s.tcp.Close())
}

// readMsg reads one length-prefixed message; its bytes are valid until the reader's
// ReleasePreviousRead.
func readMsg(r shmipc.BufferReader) ([]byte, error) {
	h, err := r.ReadBytes(4)
	if err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(h))
	if n == 0 {
		return nil, nil
	}
	return r.ReadBytes(n)
}

// writeMsg writes one length-prefixed message into the stream's buffer (Flush sends it).
func writeMsg(w shmipc.BufferWriter, p []byte) error {
	h, err := w.Reserve(4)
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(h, uint32(len(p)))
	if len(p) == 0 {
		return nil
	}
	_, err = w.WriteBytes(p)
	return err
}

// shmipcEcho answers each message with its bytes.
func shmipcEcho(st *shmipc.Stream) {
	r, w := st.BufferReader(), st.BufferWriter()
	for {
		p, err := readMsg(r)
		if err != nil {
			return
		}
		err = writeMsg(w, p)
		r.ReleasePreviousRead()
		if err != nil || st.Flush(false) != nil {
			return
		}
	}
}

func serveShmipcEcho(ln net.Listener) (Server, error) { return serveShmipc(ln, shmipcEcho) }

// shmipcClient is a SessionManager of one session to the server.
type shmipcClient struct {
	sm      *shmipc.SessionManager
	streams []*shmipc.Stream // one per worker
	req     []byte
}

func newShmipcClient(addr string) (*shmipc.SessionManager, error) {
	path, err := sameHostSocket("shmipc", addr)
	if err != nil {
		return nil, err
	}
	conf := shmipc.DefaultSessionManagerConfig()
	conf.Config = shmipcConfig()
	conf.Network, conf.Address = "unix", path
	conf.SessionNum = 1
	conf.InitializeTimeout = 10 * time.Second
	return shmipc.NewSessionManager(conf)
}

func dialShmipc(addr string, size, concurrency int) (Instance, error) {
	sm, err := newShmipcClient(addr)
	if err != nil {
		return nil, fmt.Errorf("shmipc: %w", err)
	}
	c := &shmipcClient{sm: sm, req: payload(size)}
	for range concurrency {
		st, err := sm.GetStream()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("shmipc: get stream: %w", err), c.Close())
		}
		c.streams = append(c.streams, st)
	}
	return c, nil
}

func (c *shmipcClient) Call(w int) error {
	st := c.streams[w]
	if err := writeMsg(st.BufferWriter(), c.req); err != nil {
		return err
	}
	if err := st.Flush(false); err != nil {
		return err
	}
	r := st.BufferReader()
	p, err := readMsg(r)
	if err != nil {
		return err
	}
	n := len(p)
	r.ReleasePreviousRead()
	return checkLen("shmipc", n, len(c.req))
}

func (c *shmipcClient) Copied() (uint64, bool) { return 0, false }

func (c *shmipcClient) Close() error {
	for _, st := range c.streams {
		_ = st.Close()
	}
	return c.sm.Close()
}

// The bulk service, on one stream for all transfers: a bulkRequest message asks for a
// download; an empty message starts an upload, whose messages follow until an empty one,
// and the server then answers with bulkReply.
func shmipcBulk(st *shmipc.Stream) {
	r, w := st.BufferReader(), st.BufferWriter()
	for {
		req, err := readMsg(r)
		if err != nil {
			return
		}
		if len(req) > 0 {
			total, chunk, err := parseBulkRequest(req)
			r.ReleasePreviousRead()
			if err != nil || shmipcSend(st, total, chunk) != nil {
				return
			}
			continue
		}
		r.ReleasePreviousRead()
		got, err := shmipcReceive(r)
		if err != nil || writeMsg(w, bulkReply(got)) != nil || st.Flush(false) != nil {
			return
		}
	}
}

// shmipcSend sends total bytes in messages of chunk bytes.
func shmipcSend(st *shmipc.Stream, total int64, chunk int) error {
	buf := payload(chunk)
	for sent := int64(0); sent < total; {
		n := chunkLen(total, sent, chunk)
		if err := writeMsg(st.BufferWriter(), buf[:n]); err != nil {
			return err
		}
		if err := st.Flush(false); err != nil {
			return err
		}
		sent += int64(n)
	}
	return nil
}

// shmipcReceive reads an upload's messages up to the empty one, checking each.
func shmipcReceive(r shmipc.BufferReader) (int64, error) {
	var got int64
	for {
		p, err := readMsg(r)
		if err != nil {
			return got, err
		}
		n := len(p)
		if n > 0 {
			err = checkChunk("shmipc", p, n)
		}
		r.ReleasePreviousRead()
		if err != nil || n == 0 {
			return got, err
		}
		got += int64(n)
	}
}

func serveShmipcBulk(ln net.Listener) (Server, error) { return serveShmipc(ln, shmipcBulk) }

// shmipcBulkClient keeps one stream for all its transfers, one after the other.
type shmipcBulkClient struct {
	sm  *shmipc.SessionManager
	st  *shmipc.Stream
	buf []byte
}

func dialShmipcBulk(addr string) (StreamInstance, error) {
	sm, err := newShmipcClient(addr)
	if err != nil {
		return nil, fmt.Errorf("shmipc: %w", err)
	}
	st, err := sm.GetStream()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("shmipc: get stream: %w", err), sm.Close())
	}
	return &shmipcBulkClient{sm: sm, st: st}, nil
}

func (c *shmipcBulkClient) Download(ctx context.Context, total int64, chunk int) error {
	st := c.st
	if err := writeMsg(st.BufferWriter(), bulkRequest(total, chunk)); err != nil {
		return err
	}
	if err := st.Flush(false); err != nil {
		return err
	}
	r := st.BufferReader()
	for got := int64(0); got < total; {
		if err := ctx.Err(); err != nil {
			return err
		}
		p, err := readMsg(r)
		if err != nil {
			return fmt.Errorf("shmipc: receive at %d of %d: %w", got, total, err)
		}
		n := chunkLen(total, got, chunk)
		err = checkChunk("shmipc", p, n)
		r.ReleasePreviousRead()
		if err != nil {
			return err
		}
		got += int64(n)
	}
	return nil
}

func (c *shmipcBulkClient) Upload(ctx context.Context, total int64, chunk int) error {
	if len(c.buf) != chunk {
		c.buf = payload(chunk)
	}
	st := c.st
	w := st.BufferWriter()
	if err := writeMsg(w, nil); err != nil { // an upload
		return err
	}
	for sent := int64(0); sent < total; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := chunkLen(total, sent, chunk)
		if err := writeMsg(w, c.buf[:n]); err != nil {
			return err
		}
		if err := st.Flush(false); err != nil {
			return fmt.Errorf("shmipc: send at %d of %d: %w", sent, total, err)
		}
		sent += int64(n)
	}
	if err := writeMsg(w, nil); err != nil {
		return err
	}
	if err := st.Flush(false); err != nil {
		return err
	}
	r := st.BufferReader()
	reply, err := readMsg(r)
	if err != nil {
		return fmt.Errorf("shmipc: upload's answer: %w", err)
	}
	err = checkBulkReply("shmipc", reply, total)
	r.ReleasePreviousRead()
	return err
}

func (c *shmipcBulkClient) Close() error {
	_ = c.st.Close()
	return c.sm.Close()
}
