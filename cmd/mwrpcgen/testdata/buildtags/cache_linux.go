//go:build mwrpcdemo || purego

// Package buildtags is a golden case of mwrpcgen: the output copies the source's build
// constraint and adds the GOOS of its file name (the test loads it with -tags mwrpcdemo,
// GOOS=linux).
package buildtags

import "context"

// Cache caches.
//
//mwrpc:service
type Cache interface {
	Get(ctx context.Context, key string) (*Entry, error)
}

// Entry is a cached value.
type Entry struct{ Value []byte }
