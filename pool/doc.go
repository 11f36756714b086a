// Package pool provides registered (MR-pinned) buffer pools and the rotating type-2 memory
// window allocator that the mwrpc transport builds on.
//
// # Buffers
//
// A Pool hands out buffers of a few size classes (by default the powers of two from 256 B
// to 16 MiB). Their memory is mapped outside the Go heap with verbs.Map, in slabs; each slab
// is registered once as a memory region on the pool's protection domain and then carved
// into buffers of one class. A Buf knows its bytes, its memory region (lkey and rkey) and
// its address, so it can be posted in a work request or exposed through a memory window
// as it is.
//
// Get and TryGet return a buffer; Buf.Release gives it back (Put, in sync.Pool's terms).
// Buffer memory is valid from Get until Release. After Release the bytes belong to the pool
// and to whoever gets the buffer next: a slice obtained from Bytes must not be kept, and a
// buffer posted to the NIC must not be released until its work request completes (or, for
// a buffer exposed through a memory window, until the window is invalidated). Contents are
// not cleared between uses. How these lifetimes reach an application (handlers, responses,
// streams) is in the README's Buffer lifetimes section:
// https://github.com/mwrpc/mwrpc#buffer-lifetimes
//
// The common path of Get and Release takes no lock and allocates nothing: each class keeps
// its free buffers on a few lock-free stacks, and a goroutine picks one by a cheap hint (the
// address of its own stack), so goroutines running in parallel rarely touch the same cache
// line. Only growth, waiting and Close take a per-class mutex. The bookkeeping of a buffer
// (its state, link and handle) takes 128 bytes of Go heap, a cache-line pair of its own.
//
// The pool grows by registering a new slab when a class runs out, up to Config.MaxBytes of
// registered memory in all (and Config.MaxClassBytes per class). Slabs are never
// deregistered before Close. At the cap, TryGet fails with ErrPoolExhausted and Get waits
// for a Release or for its context. The pool never registers memory for a single message.
//
// # Checks
//
// Every buffer slot has a state word (in use or free, and a generation) that Release and
// every accessor check with one atomic load, so a double Release or a use after Release
// panics with a message naming the buffer, as long as the slot has not been handed out
// again. In a debug build (build tag mwrpcdebug, and always under the race detector) each
// Get returns a fresh handle, which makes a stale handle detectable even after its slot is
// reused; freed memory is filled with a poison byte that Get verifies, so a write through a
// slice kept past Release is reported too; and leak tracking is on.
//
// With leak tracking on (Config.TrackLeaks, or a debug build) the pool records the call
// stack of every Get, and CheckLeaks (or Close) lists the buffers still out with the stack
// that took them, so a test teardown can fail on buffers it never returned.
//
// # Locked memory
//
// Registered memory is pinned, and the kernel counts pinned pages against RLIMIT_MEMLOCK
// unless the process has CAP_IPC_LOCK. New reads the limit; growth checks the bytes every
// pool of the process has registered against it before it registers a slab, the way the
// kernel does, because a software provider does not pin pages and would never fail. When
// the limit is in the way the error (ErrMemlock) names the current limit and how to raise
// it. See Config.Memlock.
//
// The limit is read per OS: RLIMIT_MEMLOCK on Linux (where CAP_IPC_LOCK lifts it), on
// macOS and on the BSDs (where nothing lifts it); Windows has none, so the pool's own check
// never refuses there, and Config.Lock's VirtualLock is bounded by the process's working
// set instead.
//
// # Memory windows
//
// Windows is the per-queue-pair allocator of type-2 memory windows: Next hands out a free
// window with the rkey its next bind will use (verbs.IncRkey of the last one), BindWR and
// BindBufWR build the BIND_MW work request and record what the window exposes and since
// when, and Invalidated returns the window to the free ring once a SEND_WITH_INV from the
// peer or a LOCAL_INV of ours has revoked it. Expired lists the bindings older than a
// lease, for reclaim with LOCAL_INV.
package pool
