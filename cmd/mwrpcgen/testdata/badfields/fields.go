// Package badfields is an error case of mwrpcgen (-type Svc): request and response types
// with fields the msgpack codec cannot carry, nested and in collections, beside fields
// that are fine (tagged out, encoding themselves, any) and unexported ones (warnings).
package badfields

import (
	"context"
	"io"
	"time"
	"unsafe"
)

// Svc is the service.
type Svc interface {
	Get(ctx context.Context, req *GetRequest) (*GetResponse, error)
	Put(ctx context.Context, req PutRequest) (*Node, error)
}

// GetRequest has one field of each kind that cannot travel.
type GetRequest struct {
	Key     string
	Ch      chan int
	Fn      func() error
	Ptr     unsafe.Pointer
	C       complex128
	Skipped chan int  `msgpack:"-"`
	When    time.Time // encodes itself
	Opts    *Options
	hidden  int
}

// Options nests them in collections.
type Options struct {
	Callbacks []func()
	ByName    map[string]chan bool
	Err       error
	Any       any
}

// GetResponse is fine.
type GetResponse struct{ Value []byte }

// PutRequest refers to itself, and to an interface.
type PutRequest struct {
	Next   *PutRequest
	Reader io.Reader
}

// Node refers to itself and is fine.
type Node struct {
	Children []*Node
	Data     []byte
}
