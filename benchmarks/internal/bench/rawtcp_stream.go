package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// rawTCPStreamDesc describes rawtcp in the streaming cell.
const rawTCPStreamDesc = "bulk copy over one loopback TCP connection: a 17-byte header (direction, total, chunk), then the bytes in chunk-sized write(2)s and io.ReadFull reads into one reused buffer (io.Copy-like): the floor"

// The raw TCP bulk protocol: the client sends a header, rawBulkHeaderLen bytes: an
// operation byte, then the total and the chunk size as little-endian uint64s.
// rawBulkDownload: the server writes total bytes of the pattern, chunk bytes a write.
// rawBulkUpload: the client writes total bytes, the server reads them chunk bytes at a
// time, then writes bulkReply. One operation at a time per connection.
const (
	rawBulkHeaderLen = 1 + bulkRequestLen
	rawBulkDownload  = 'D'
	rawBulkUpload    = 'U'
)

func serveRawTCPBulk(ln net.Listener) (Server, error) { return serveRawConns(ln, rawTCPBulkServe), nil }

// rawTCPBulkServe serves bulk operations on c until the peer closes it or breaks the
// protocol.
func rawTCPBulkServe(c net.Conn) {
	defer c.Close()
	var hdr [rawBulkHeaderLen]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		total, chunk, err := parseBulkRequest(hdr[1:])
		if err != nil {
			return
		}
		if len(buf) != chunk {
			buf = payload(chunk)
		}
		switch hdr[0] {
		case rawBulkDownload:
			for sent := int64(0); sent < total; {
				n := chunkLen(total, sent, chunk)
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
				sent += int64(n)
			}
		case rawBulkUpload:
			for got := int64(0); got < total; {
				n := chunkLen(total, got, chunk)
				if _, err := io.ReadFull(c, buf[:n]); err != nil {
					return
				}
				if checkChunk("rawtcp", buf[:n], n) != nil {
					return
				}
				got += int64(n)
			}
			if _, err := c.Write(bulkReply(total)); err != nil {
				return
			}
		default:
			return
		}
	}
}

// rawTCPBulkClient is the floor's streaming client: one connection.
type rawTCPBulkClient struct {
	c   net.Conn
	buf []byte
}

func dialRawTCPBulk(addr string) (StreamInstance, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	return &rawTCPBulkClient{c: c}, nil
}

// start sets the connection's deadline from ctx, writes the header of operation op, and
// makes buf a chunk of the pattern.
func (r *rawTCPBulkClient) start(ctx context.Context, op byte, total int64, chunk int) error {
	dl, _ := ctx.Deadline() // zero: none
	if err := r.c.SetDeadline(dl); err != nil {
		return err
	}
	if len(r.buf) != chunk {
		r.buf = payload(chunk)
	}
	_, err := r.c.Write(append([]byte{op}, bulkRequest(total, chunk)...))
	return err
}

func (r *rawTCPBulkClient) Download(ctx context.Context, total int64, chunk int) error {
	if err := r.start(ctx, rawBulkDownload, total, chunk); err != nil {
		return err
	}
	for got := int64(0); got < total; {
		n := chunkLen(total, got, chunk)
		if _, err := io.ReadFull(r.c, r.buf[:n]); err != nil {
			return fmt.Errorf("rawtcp: read at %d of %d: %w", got, total, err)
		}
		if err := checkChunk("rawtcp", r.buf[:n], n); err != nil {
			return err
		}
		got += int64(n)
	}
	return r.c.SetDeadline(time.Time{})
}

func (r *rawTCPBulkClient) Upload(ctx context.Context, total int64, chunk int) error {
	if err := r.start(ctx, rawBulkUpload, total, chunk); err != nil {
		return err
	}
	for sent := int64(0); sent < total; {
		n := chunkLen(total, sent, chunk)
		if _, err := r.c.Write(r.buf[:n]); err != nil {
			return fmt.Errorf("rawtcp: write at %d of %d: %w", sent, total, err)
		}
		sent += int64(n)
	}
	var reply [8]byte
	if _, err := io.ReadFull(r.c, reply[:]); err != nil {
		return fmt.Errorf("rawtcp: upload's answer: %w", err)
	}
	return errors.Join(checkBulkReply("rawtcp", reply[:], total), r.c.SetDeadline(time.Time{}))
}

func (r *rawTCPBulkClient) Close() error { return r.c.Close() }
