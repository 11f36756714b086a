package e2e

import (
	"bytes"
	"context"
	"iter"
	"net"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/rpc"

	stream "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/stream"
)

// filesImpl implements the stream case's service.
type filesImpl struct{}

func (filesImpl) Stat(ctx context.Context, req *stream.StatRequest) (*stream.StatReply, error) {
	return &stream.StatReply{Size: int64(len(req.Name))}, nil
}

func (filesImpl) Download(ctx context.Context, req *stream.StatRequest) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		for i := range 3 {
			if !yield(bytes.Repeat([]byte(req.Name), i+1), nil) {
				return
			}
		}
	}
}

func (filesImpl) Upload(ctx context.Context, in iter.Seq2[*stream.Chunk, error]) (*stream.StatReply, error) {
	var n int64
	for c, err := range in {
		if err != nil {
			return nil, err
		}
		n += int64(len(c.Data))
	}
	return &stream.StatReply{Size: n}, nil
}

func (filesImpl) Echo(ctx context.Context, in iter.Seq2[stream.Chunk, error]) iter.Seq2[stream.Chunk, error] {
	return func(yield func(stream.Chunk, error) bool) {
		for c, err := range in {
			if !yield(c, err) || err != nil {
				return
			}
		}
	}
}

func (filesImpl) Sum(ctx context.Context, in iter.Seq2[int64, error]) (int64, error) {
	var s int64
	for v, err := range in {
		if err != nil {
			return 0, err
		}
		s += v
	}
	return s, nil
}

func (filesImpl) Raw(ctx context.Context, req []byte) iter.Seq2[*stream.Chunk, error] {
	return func(yield func(*stream.Chunk, error) bool) {
		yield(&stream.Chunk{Offset: 7, Data: req}, nil)
	}
}

// seq yields vs.
func seq[T any](vs ...T) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for _, v := range vs {
			if !yield(v, nil) {
				return
			}
		}
	}
}

// TestStreams calls every streaming method of the stream case through the generated
// client and handlers.
func TestStreams(t *testing.T) {
	srv := rpc.NewServer()
	stream.RegisterFiles(srv, filesImpl{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var files stream.Files = stream.NewFilesClient(client)

	var got []string
	for b, err := range files.Download(ctx, &stream.StatRequest{Name: "ab"}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(b))
	}
	if len(got) != 3 || got[2] != "ababab" {
		t.Fatalf("Download: %q", got)
	}
	if r, err := files.Upload(ctx, seq(&stream.Chunk{Data: []byte("abc")}, &stream.Chunk{Data: []byte("de")})); err != nil || r.Size != 5 {
		t.Fatalf("Upload: %+v %v", r, err)
	}
	n := 0
	for c, err := range files.Echo(ctx, seq(stream.Chunk{Offset: 1}, stream.Chunk{Offset: 2})) {
		if err != nil || c.Offset != int64(n+1) {
			t.Fatalf("Echo %d: %+v %v", n, c, err)
		}
		n++
	}
	if n != 2 {
		t.Fatalf("Echo: %d messages", n)
	}
	if s, err := files.Sum(ctx, seq[int64](1, 2, 3)); err != nil || s != 6 {
		t.Fatalf("Sum: %d %v", s, err)
	}
	for c, err := range files.Raw(ctx, []byte("raw")) {
		if err != nil || c.Offset != 7 || string(c.Data) != "raw" {
			t.Fatalf("Raw: %+v %v", c, err)
		}
	}
	if r, err := files.Stat(ctx, &stream.StatRequest{Name: "abcd"}); err != nil || r.Size != 4 {
		t.Fatalf("Stat: %+v %v", r, err)
	}
}
