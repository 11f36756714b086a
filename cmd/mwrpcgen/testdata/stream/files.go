// Package files is a golden case: a service with every kind of stream.
package files

import (
	"context"
	"iter"
)

// Files moves files.
type Files interface {
	// Stat is unary, beside the streams.
	Stat(ctx context.Context, req *StatRequest) (*StatReply, error)
	// Download is server streaming, of []byte.
	Download(ctx context.Context, req *StatRequest) iter.Seq2[[]byte, error]
	// Upload is client streaming, of pointers.
	Upload(ctx context.Context, in iter.Seq2[*Chunk, error]) (*StatReply, error)
	// Echo is bidirectional, of values.
	Echo(ctx context.Context, in iter.Seq2[Chunk, error]) iter.Seq2[Chunk, error]
	// Sum is client streaming of a basic type, with a value reply.
	Sum(ctx context.Context, in iter.Seq2[int64, error]) (int64, error)
	// Raw is server streaming with a []byte request.
	Raw(ctx context.Context, req []byte) iter.Seq2[*Chunk, error]
}

// StatRequest names a file.
type StatRequest struct{ Name string }

// StatReply describes a file.
type StatReply struct{ Size int64 }

// Chunk is a piece of a file.
type Chunk struct {
	Offset int64
	Data   []byte
}
