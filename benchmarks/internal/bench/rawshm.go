package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/mwrpc/mwrpc/transport/verbs/shm"
)

// rawSHMDesc describes rawshm.
const rawSHMDesc = "the floor over the shm fabric's rings: shm.Conn (the rings and doorbells mwrpc-shm's queue pairs use) without the verbs model, one connection shared by all callers, each message a call ID and a length before the payload; a reader a side, the server echoing inline, the client's reader handing each response's arrival to its caller, who reads nothing of it, as shmipc-go's caller (same host only)"

// rawSHMHeader is a rawshm message's header: the caller's index and the payload's length.
const rawSHMHeader = 8

// serveRawSHM serves rawshm at the shm socket of the harness's listener ln.
func serveRawSHM(ln net.Listener) (Server, error) {
	path, err := sameHostSocket("rawshm", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	_ = os.Remove(path) // left by a server process that was killed
	sln, err := shm.Listen(path, shm.Config{})
	if err != nil {
		return nil, err
	}
	return &sameHostServer{Server: serveRawConns(sln, rawSHMServe), tcp: ln}, nil
}

// rawSHMServe echoes rawshm messages of at most rawTCPMax bytes, each written back as
// soon as it is whole, until the peer closes or sends a longer one.
func rawSHMServe(c net.Conn) {
	defer c.Close()
	_ = readRawSHM(c, func(msg []byte) error {
		_, err := c.Write(msg)
		return err
	})
}

// readRawSHM reads rawshm messages from c and hands each whole one, header and payload,
// to each (valid until each returns), until c fails, a message's length is above
// rawTCPMax, or each fails. Its buffer grows to the largest message seen.
func readRawSHM(c net.Conn, each func(msg []byte) error) error {
	buf := make([]byte, 64<<10)
	have := 0
	for {
		n, err := c.Read(buf[have:])
		if err != nil {
			return err
		}
		have += n
		off := 0
		for have-off >= rawSHMHeader {
			size := int(binary.LittleEndian.Uint32(buf[off+4:]))
			if size > rawTCPMax {
				return fmt.Errorf("rawshm: message of %d bytes (max %d)", size, rawTCPMax)
			}
			end := off + rawSHMHeader + size
			if end > have {
				if end-off > len(buf) { // room for the whole message
					buf = append(buf[:have], make([]byte, end-off-have)...)
				}
				break
			}
			if err := each(buf[off:end]); err != nil {
				return err
			}
			off = end
		}
		have = copy(buf, buf[off:have])
	}
}

// rawSHMInstance is rawshm's client: one connection, a reader that tells each caller its
// response came.
type rawSHMInstance struct {
	conn    net.Conn
	wmu     sync.Mutex // one caller writes at a time
	msgs    [][]byte   // per caller: its index, the length, the payload
	arrived []chan struct{}
	done    chan struct{} // closed when the reader stops
	err     error         // why it stopped; read after done
}

func dialRawSHM(addr string, size, concurrency int) (Instance, error) {
	path, err := sameHostSocket("rawshm", addr)
	if err != nil {
		return nil, err
	}
	c, err := shm.Dial(context.Background(), path, shm.Config{})
	if err != nil {
		return nil, fmt.Errorf("rawshm: dial: %w", err)
	}
	r := &rawSHMInstance{conn: c, done: make(chan struct{})}
	body := payload(size)
	for w := range concurrency {
		m := binary.LittleEndian.AppendUint32(make([]byte, 0, rawSHMHeader+size), uint32(w))
		m = binary.LittleEndian.AppendUint32(m, uint32(size))
		r.msgs = append(r.msgs, append(m, body...))
		r.arrived = append(r.arrived, make(chan struct{}, 1))
	}
	go r.read(size)
	return r, nil
}

// read hands each response to its caller until the connection ends or a response is
// not one a caller waits for.
func (r *rawSHMInstance) read(size int) {
	defer close(r.done)
	r.err = readRawSHM(r.conn, func(msg []byte) error {
		w, n := binary.LittleEndian.Uint32(msg), len(msg)-rawSHMHeader
		if int(w) >= len(r.arrived) || n != size {
			return fmt.Errorf("rawshm: response for caller %d of %d bytes (%d callers, %d-byte requests)", w, n, len(r.arrived), size)
		}
		select {
		case r.arrived[w] <- struct{}{}:
			return nil
		default:
			return fmt.Errorf("rawshm: a second response for caller %d", w)
		}
	})
}

func (r *rawSHMInstance) Call(w int) error {
	r.wmu.Lock()
	_, err := r.conn.Write(r.msgs[w])
	r.wmu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-r.arrived[w]:
		return nil
	case <-r.done:
		return fmt.Errorf("rawshm: the connection ended: %w", r.err)
	}
}

func (r *rawSHMInstance) Copied() (uint64, bool) { return 0, false }

func (r *rawSHMInstance) Close() error {
	err := r.conn.Close()
	<-r.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
