// Package imports is a golden case of mwrpcgen (-type Catalog): types from other packages
// whose names collide with each other, with the packages the generated code imports, and
// with a declaration of this package; a method from an embedded interface; a generic type.
package imports

import (
	"context"

	atypes "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/a/types"
	btypes "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/b/types"
	cee "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/c/v2"
	myrpc "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/rpc"
)

// types is a package-level name: no import of the generated file may take it.
var types = []string{"a", "b"}

// Catalog lists items.
type Catalog interface {
	atypes.Base

	// List returns a page of items of another package.
	List(ctx context.Context, f *btypes.Filter) (*atypes.Page[btypes.Item], error)
	// Lookup takes a type from a package named unlike its path.
	Lookup(ctx context.Context, code cee.Code) (atypes.Item, error)
	// Call uses a package named rpc.
	Call(ctx context.Context, req *myrpc.Req) (*myrpc.Req, error)
}

// Kinds uses types.
func Kinds() []string { return types }
