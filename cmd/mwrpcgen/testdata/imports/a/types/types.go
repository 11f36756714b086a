// Package types (a) is imported by the imports case, along with another package named
// types.
package types

import "context"

// Item is an entry of a page.
type Item struct{ Name string }

// Page is a generic page of results.
type Page[T any] struct {
	Items []T
	Next  string
}

// Ping is a request.
type Ping struct{ Seq int }

// Pong is a response.
type Pong struct{ Seq int }

// Base is embedded in a service of another package.
type Base interface {
	Ping(ctx context.Context, req *Ping) (*Pong, error)
}
