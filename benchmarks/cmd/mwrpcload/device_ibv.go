//go:build ibverbs && linux && cgo

package main

import (
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/ibv"
)

func init() {
	openDevice = func(name string) (verbs.Device, error) { return ibv.Open(name) }
}
