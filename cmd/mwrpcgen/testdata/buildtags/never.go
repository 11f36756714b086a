//go:build never

package buildtags

import "context"

// Never is in a file the build excludes, so mwrpcgen does not see it.
//
//mwrpc:service
type Never interface {
	Get(ctx context.Context, key string) (*Entry, error)
}
