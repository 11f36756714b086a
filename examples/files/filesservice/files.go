// Package filesservice is the streaming example's service: a Go interface whose methods
// are streams, its types and an implementation. files_mwrpc.go is generated from it.
package filesservice

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"

	"github.com/mwrpc/mwrpc/rpc"
)

//go:generate go run github.com/mwrpc/mwrpc/cmd/mwrpcgen -type Files

// Files moves bytes in streams: the three kinds a Go interface can declare.
type Files interface {
	// Download sends Size bytes of the content Seed names, in chunks of ChunkSize
	// (server streaming).
	Download(ctx context.Context, req *DownloadRequest) iter.Seq2[[]byte, error]
	// Upload takes chunks until the caller is done and says what arrived (client
	// streaming).
	Upload(ctx context.Context, in iter.Seq2[[]byte, error]) (*Summary, error)
	// Echo answers each message with the same one (bidirectional).
	Echo(ctx context.Context, in iter.Seq2[*Message, error]) iter.Seq2[*Message, error]
}

// DownloadRequest names content: Size bytes of Content(Seed), sent ChunkSize at a time.
type DownloadRequest struct {
	Size      int64
	ChunkSize int
	Seed      uint64
}

// Summary is what an upload delivered: its length and SHA-256.
type Summary struct {
	Bytes  int64
	SHA256 []byte
}

// Message is one message of Echo.
type Message struct {
	Seq  int
	Text string
}

// MaxChunk bounds a Download's chunks: what one request may make the server hold.
const MaxChunk = 16 << 20

// Server implements Files.
type Server struct{}

// Download yields the content in chunks, each built in registered memory
// (rpc.StreamBuffer) so that it leaves without a copy; called outside a server, it reuses
// one ordinary buffer (the caller has the chunk until yield returns).
func (Server) Download(ctx context.Context, req *DownloadRequest) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		if req.Size < 0 || req.ChunkSize <= 0 || req.ChunkSize > MaxChunk {
			yield(nil, rpc.Errorf(rpc.InvalidArgument, "download of %d bytes in chunks of %d (1..%d)", req.Size, req.ChunkSize, MaxChunk))
			return
		}
		c := NewContent(req.Seed)
		var plain []byte
		for left := req.Size; left > 0; {
			n := int(min(left, int64(req.ChunkSize)))
			chunk, err := rpc.StreamBuffer(ctx, n)
			if rpc.CodeOf(err) == rpc.FailedPrecondition { // not served by an rpc.Server
				if plain == nil {
					plain = make([]byte, req.ChunkSize)
				}
				chunk, err = plain[:n], nil
			}
			if err != nil {
				yield(nil, err)
				return
			}
			c.Read(chunk)
			if !yield(chunk, nil) {
				return // the caller stopped reading, or went away
			}
			left -= int64(n)
		}
	}
}

// Upload hashes what arrives. Each chunk aliases the transport's registered memory until
// the loop asks for the next one, so it is hashed, not kept.
func (Server) Upload(ctx context.Context, in iter.Seq2[[]byte, error]) (*Summary, error) {
	h := sha256.New()
	var n int64
	for chunk, err := range in {
		if err != nil {
			return nil, err
		}
		h.Write(chunk)
		n += int64(len(chunk))
	}
	return &Summary{Bytes: n, SHA256: h.Sum(nil)}, nil
}

// Echo answers each message as it comes.
func (Server) Echo(ctx context.Context, in iter.Seq2[*Message, error]) iter.Seq2[*Message, error] {
	return func(yield func(*Message, error) bool) {
		for m, err := range in {
			if err != nil {
				yield(nil, err)
				return
			}
			if m.Text == "" {
				yield(nil, rpc.Errorf(rpc.InvalidArgument, "message %d is empty", m.Seq))
				return
			}
			if !yield(&Message{Seq: m.Seq, Text: m.Text}, nil) {
				return
			}
		}
	}
}

// Content is a cheap deterministic byte stream (splitmix64 of each 8-byte block's
// index), the same however it is cut into reads, so that both ends can produce and check
// gigabytes without storing them.
type Content struct{ seed, off uint64 }

// NewContent returns the content seed names.
func NewContent(seed uint64) *Content { return &Content{seed: seed} }

func (c *Content) block(k uint64) uint64 {
	z := c.seed + (k+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Read fills p with the next len(p) bytes of the content.
func (c *Content) Read(p []byte) {
	i := 0
	for ; i < len(p) && (c.off%8 != 0 || len(p)-i < 8); i++ {
		p[i] = byte(c.block(c.off/8) >> (8 * (c.off % 8)))
		c.off++
	}
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], c.block(c.off/8))
		c.off += 8
	}
	for ; i < len(p); i++ {
		p[i] = byte(c.block(c.off/8) >> (8 * (c.off % 8)))
		c.off++
	}
}

// Digest returns the SHA-256 of the first size bytes of Content(seed).
func Digest(seed uint64, size int64) []byte {
	h := sha256.New()
	c := NewContent(seed)
	buf := make([]byte, 1<<20)
	for left := size; left > 0; {
		n := int(min(left, int64(len(buf))))
		c.Read(buf[:n])
		h.Write(buf[:n])
		left -= int64(n)
	}
	return h.Sum(nil)
}

// ErrMismatch is returned by the example's checks when what arrived is not what was sent.
var ErrMismatch = errors.New("checksum mismatch")

// CheckDigest compares got with want, naming what.
func CheckDigest(what string, got, want []byte) error {
	if string(got) != string(want) {
		return fmt.Errorf("%s: SHA-256 %x, want %x: %w", what, got, want, ErrMismatch)
	}
	return nil
}
