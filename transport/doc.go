// Package transport is mwrpc's zero-copy call path over the verbs model: one reliable
// connected queue pair per connection, eager SENDs for small payloads, and rotating type-2
// memory windows for large ones, fetched by the peer with one-sided RDMA READ and revoked
// with SEND_WITH_INV as soon as it has the bytes.
//
// # Call path
//
// A payload of at most the eager threshold travels inside one SEND, behind a 32-byte
// header, into a receive slot the peer pre-posted from its registered pool; the handler (or
// the caller) reads it where it landed. A larger payload stays where it was written, in a
// registered buffer: the sender binds the next window of the connection over exactly those
// bytes and, on the same QP right after the bind, SENDs a header with {addr, len, rkey}. The
// receiver READs into a registered buffer of its own and revokes the window: a caller
// releases a response window with SEND_WITH_INV (on its next request when one is being
// posted, else alone); a server revokes a request window with the SEND_WITH_INV that
// carries the response. The owner frees the buffer when the receive completion shows the
// invalidation. A window the peer never releases is reclaimed with LOCAL_INV when its lease
// expires, or when the connection dies; no window is invalidated twice. Where a READ costs
// a round trip through the peer's CPU (the soft TCP fabric), a caller exposes a large
// request's window for writing too, and a response no longer than the request is written
// into it (RDMA WRITE) and announced by the SEND_WITH_INV that revokes it
// (docs/protocol.md, "Written responses").
//
// Every SEND consumes one of the peer's receive slots: credits, returned in every header,
// bound what each side may have outstanding, so no SEND ever meets an empty receive queue.
//
// # Lifetimes
//
// A request payload a handler receives aliases registered memory and is valid until the
// handler returns. A response's Bytes alias registered memory and are valid until
// Response.Release; a response holds one of the connection's receive slots (or a pool
// buffer) until then, so release promptly: unreleased responses stall the connection. Copy
// whatever must outlive these. Every rule, for this package and rpc, is in the README's
// Buffer lifetimes section: https://github.com/mwrpc/mwrpc#buffer-lifetimes
//
// # Completions
//
// Completions are reaped by poller goroutines (PollBusy, PollAdaptive, PollEvent), each
// locked to its OS thread while it spins; on the soft TCP fabric the stream reader that
// delivered a message into a parked poller's queue dispatches it itself. Requests go to a bounded handler pool (github.com/panjf2000/ants/v2); when it
// is full the caller gets StatusResourceExhausted. A handler known to be short runs to
// completion on the goroutine that reaped its request instead: a method whose last runs
// all took less than Config.InlineBudget (on by default, for handlers that implement
// InlineAdvisor, as the rpc server does), or every handler with Config.InlineHandlers.
package transport
