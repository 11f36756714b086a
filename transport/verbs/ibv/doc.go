// Package ibv is the verbs provider over libibverbs (rdma-core), through cgo: real RDMA
// NICs, and the kernel's Soft-RoCE (rdma_rxe), on which it is tested.
//
// Everything but this file is built only with the build tag ibverbs, on Linux, with cgo
// and the libibverbs headers (Debian: libibverbs-dev):
//
//	go test -tags ibverbs ./transport/verbs/ibv/
//
// so that the default build of mwrpc stays pure Go. Without the tag the package is empty.
//
// ibv.Open opens a device and returns a *Device, which implements verbs.Device with the
// semantics of package verbs and its conformance suite (package verbstest); where rxe
// deviates from the IBTA, the package's conformance test names the case and says why.
// Registered memory comes from verbs.Map, never the Go heap. Each PostSend, PostRecv
// (of a QP or a shared receive queue) and Poll is one cgo call over memory allocated once
// per queue pair, shared receive queue or completion queue.
//
// Environment:
//
//	MWRPC_IBV_GID_INDEX  the GID index queue pairs use (default: the first RoCE v2 GID
//	                     that maps an IPv4 address, else the first RoCE v2 GID, else 0)
//
// `make test-rxe` builds the package's tests with the tag and runs them against Soft-RoCE
// in a throw-away VM (scripts/rxe-vm).
package ibv
