// Package badsig is an error case of mwrpcgen (-type Bad,Good): methods of every wrong
// shape. Good is right, but nothing is written for a package with errors.
package badsig

import (
	"context"
	"unsafe"
)

// Bad has only wrong methods.
type Bad interface {
	Map(ctx context.Context, req map[string]int) (*Req, error)
	Chan(ctx context.Context, req *Req) (chan int, error)
	Func(ctx context.Context, req func()) (*Req, error)
	Any(ctx context.Context, req any) (*Req, error)
	Iface(ctx context.Context, req interface{ M() }) (*Req, error)
	Strings(ctx context.Context, req []string) (*Req, error)
	Array(ctx context.Context, req [4]byte) (*Req, error)
	PtrInt(ctx context.Context, req *int) (*Req, error)
	PtrPtr(ctx context.Context, req **Req) (*Req, error)
	Named(ctx context.Context, req Blob) (ReqPtr, error)
	Complex(ctx context.Context, req complex128) (uintptr, error)
	Unsafe(ctx context.Context, req unsafe.Pointer) (*Req, error)
	Variadic(ctx context.Context, reqs ...*Req) (*Req, error)
	NoCtx(req *Req) (*Req, error)
	CtxSecond(req *Req, ctx context.Context) (*Req, error)
	Three(ctx context.Context, a, b *Req) (*Req, error)
	OneResult(ctx context.Context, req *Req) error
	NoError(ctx context.Context, req *Req) (*Req, string)
	ThreeResults(ctx context.Context, req *Req) (*Req, int, error)
	Both(ctx context.Context, req chan int) (map[int]int, error)
	unexported(ctx context.Context, req *Req) (*Req, error)
}

// Good is a valid service.
type Good interface {
	Get(ctx context.Context, req *Req) (*Req, error)
}

// Req is a request.
type Req struct{}

// Blob is a named byte slice (only []byte itself is allowed).
type Blob []byte

// ReqPtr is a named pointer type (only an unnamed pointer to a struct is allowed).
type ReqPtr *Req
