package badsig

import (
	"context"
	"iter"
)

// BadStream has malformed stream signatures.
type BadStream interface {
	NoError(ctx context.Context, req *Req) iter.Seq[*Req]
	WrongSecond(ctx context.Context, in iter.Seq2[*Req, string]) (*Req, error)
	WithError(ctx context.Context, req *Req) (iter.Seq2[*Req, error], error)
	Channel(ctx context.Context, in chan *Req) (*Req, error)
	BadElem(ctx context.Context, in iter.Seq2[func(), error]) (*Req, error)
}
