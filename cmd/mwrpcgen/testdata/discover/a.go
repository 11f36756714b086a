// Package discover is a golden case of mwrpcgen without -type: the interfaces marked
// //mwrpc:service, in two files. Earlier outputs in the package are stale: b_mwrpc.go is
// rewritten, old_mwrpc.go (whose source file holds no service any more) removed, and
// main.go uses names that are not generated yet.
package discover

import "context"

// Greeter greets.
//
//mwrpc:service
type Greeter interface {
	Greet(ctx context.Context, name string) (string, error)
}

// NotAService has no marker.
type NotAService interface {
	M(ctx context.Context, x int) (int, error)
}

type (
	// Counter counts; it is marked inside a group.
	//
	//mwrpc:service
	Counter interface {
		Incr(ctx context.Context, n int64) (int64, error)
	}

	// Unmarked is in the same group, without the marker.
	Unmarked interface {
		M(ctx context.Context, x int) (int, error)
	}
)
