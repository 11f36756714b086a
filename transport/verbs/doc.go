// Package verbs is a Go model of the subset of libibverbs that mwrpc uses: devices,
// protection domains, memory regions, memory windows (type 1 and type 2), reliable-connected
// queue pairs, shared receive queues, completion queues, work requests and work
// completions.
//
// The package holds only the model: interfaces, typed enums and helpers whose semantics
// follow libibverbs and the IBTA specification exactly (see docs/verbs.md and the
// conformance suite in package verbstest). Providers implement it:
//
//   - transport/verbs/soft: a software NIC in pure Go (in-process and TCP fabrics).
//   - transport/verbs/ibv: cgo over libibverbs (build tag ibverbs).
//
// # Memory
//
// Registered memory never comes from the Go heap: Map allocates it with mmap, and RegMR
// refuses any slice that does not lie inside a live mapping. A mapping cannot be unmapped
// while a memory region is registered over it, so a NIC never touches freed memory.
//
// # Ownership
//
// A work request's scatter/gather memory belongs to the NIC from PostSend/PostRecv until
// the work request's completion is polled (or, for an unsignaled work request, until a later
// signaled one on the same send queue completes). Providers copy the WR structs themselves
// at post time, so the caller may reuse its []SendWR and []SGE slices immediately.
package verbs
