package pool

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Errors returned by the pool; match them with errors.Is.
var (
	// ErrPoolExhausted is returned by TryGet, and by Get when its context ends, while every
	// buffer of the class is in use and the class may not grow. The error names the class
	// and the cap.
	ErrPoolExhausted = errors.New("pool exhausted")
	// ErrTooLarge is a Get of more bytes than the largest class holds. The pool never
	// registers memory for one message; send such payloads in pieces.
	ErrTooLarge = errors.New("larger than the largest buffer class")
	// ErrClosed is a call on a closed Pool or Windows.
	ErrClosed = errors.New("closed")
)

// ExhaustedError is the error of a Get that found no free buffer in its class and no room
// to register another slab. It matches ErrPoolExhausted with errors.Is.
type ExhaustedError struct {
	Size     int   // the class's buffer size
	ClassCap int64 // bytes the class may register (MaxClassBytes, or MaxBytes)
	PoolCap  int64 // bytes the whole pool may register (MaxBytes)
}

// Error names the class and the caps.
func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("pool: class %s exhausted: every buffer is in use and no slab may be added (class cap %s, pool cap %s)",
		sizeString(int64(e.Size)), sizeString(e.ClassCap), sizeString(e.PoolCap))
}

// Is reports whether target is ErrPoolExhausted.
func (e *ExhaustedError) Is(target error) bool { return target == ErrPoolExhausted }

// Pool is a pool of registered buffers in size classes. Its methods are safe for concurrent
// use, except that Close must not race with Get or TryGet.
type Pool struct {
	cfg     Config
	pd      verbs.PD
	classes []*class
	// Class lookup: with power-of-two classes doubling from minSize, the class of n is
	// bits.Len(n-1)-minShift; otherwise a binary search.
	minSize  int
	maxSize  int
	minShift int
	pow2     bool

	closed     atomic.Bool
	registered atomic.Int64 // bytes of this pool's slabs, reserved before mapping
	hugeWarned atomic.Bool
}

// class is one size class.
type class struct {
	p         *Pool
	size      int
	count     int    // buffers per slab, a power of two
	slabShift uint32 // log2(count): slot index = slab<<slabShift | index in slab
	slabMask  uint32
	mapBytes  int // bytes mapped per slab
	shards    []shard
	shardMask uint32 // hint & shardMask picks the shard
	slabs     []atomic.Pointer[slab]
	exhausted *ExhaustedError

	nslabs    atomic.Int32
	waiters   atomic.Int32
	waits     atomic.Uint64
	failed    atomic.Uint64
	mu        sync.Mutex    // growth, waiting, Close
	wake      chan struct{} // guarded by mu; closed (and replaced) to wake every waiter
	hugeSlabs int           // guarded by mu
}

// slab is one mapping registered as one memory region, carved into count buffers.
type slab struct {
	c      *class
	no     int
	mem    *verbs.Memory
	mr     verbs.MR
	lkey   uint32
	rkey   uint32
	locked bool
	slots  []slot
}

// slot is one buffer of a slab: its memory, its state, its free-list link, and (in a
// release build) the handle Get returns. It is padded to 128 bytes, and a slab's slots
// (a power-of-two count) are allocated together, so each slot has a 128-byte-aligned pair
// of cache lines to itself: x86 prefetchers fetch lines in such pairs, and with 64-byte
// slots two goroutines using neighbouring buffers halved each other's throughput.
type slot struct {
	// word is the slot's state (generation<<1 | in use) and, while the slot is free, its
	// free-list link (see shard). Get bumps the generation, so a handle from an earlier
	// Get no longer matches.
	word  atomic.Uint64
	ptr   unsafe.Pointer // the buffer's first byte, in mapped memory outside the Go heap
	slab  *slab
	taken atomic.Pointer[getRecord] // who took it, with leak tracking on
	h     Buf                       // the handle a release build reuses
	ref   uint32                    // index in the class plus one
	home  uint32                    // the shard Release pushes to: the getter's
	size  uint32                    // the class size
	// Pad to slotSize: the fields above are 32 bytes and four pointers, and h's padding
	// to pointer alignment (a pointer and three uint32s: 4 bytes on 64 bits, none on 32).
	_ [slotSize - 32 - 4*unsafe.Sizeof(uintptr(0)) - (unsafe.Sizeof(uintptr(0)) - 4)]byte
}

const slotSize = 128

// bytes returns the whole buffer: len = cap = class size.
func (s *slot) bytes() []byte { return unsafe.Slice((*byte)(s.ptr), s.size) }

// addr returns the buffer's virtual address.
func (s *slot) addr() uint64 { return uint64(uintptr(s.ptr)) }

// New creates a pool whose slabs are registered on pd as cfg asks. It reads
// RLIMIT_MEMLOCK and warns (through cfg.Logger) when the cap exceeds it; it registers
// cfg.Prealloc slabs per class and fails if that fails.
func New(pd verbs.PD, cfg Config) (*Pool, error) {
	if pd == nil {
		return nil, fmt.Errorf("pool: nil protection domain: %w", verbs.ErrInvalid)
	}
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, verbs.ErrInvalid)
	}
	p := &Pool{cfg: cfg, pd: pd, minSize: cfg.Classes[0], maxSize: cfg.Classes[len(cfg.Classes)-1]}
	p.pow2 = true
	for i, s := range cfg.Classes {
		if s&(s-1) != 0 || (i > 0 && s != 2*cfg.Classes[i-1]) {
			p.pow2 = false
		}
	}
	p.minShift = bits.Len(uint(p.minSize - 1))
	for _, size := range cfg.Classes {
		count, mapBytes := cfg.slabGeometry(size)
		capBytes := cfg.MaxBytes
		if cfg.MaxClassBytes > 0 {
			capBytes = min(capBytes, cfg.MaxClassBytes)
		}
		maxSlabs := capBytes / int64(mapBytes)
		if maxSlabs == 0 {
			return nil, fmt.Errorf("pool: class %s needs %s slabs but its cap is %s; raise MaxBytes/MaxClassBytes or drop the class: %w",
				sizeString(int64(size)), sizeString(int64(mapBytes)), sizeString(capBytes), verbs.ErrInvalid)
		}
		if maxSlabs*int64(count) >= 1<<31 {
			return nil, fmt.Errorf("pool: class %s would hold %d buffers, more than 2^31; lower the cap: %w",
				sizeString(int64(size)), maxSlabs*int64(count), verbs.ErrInvalid)
		}
		c := &class{
			p: p, size: size, count: count,
			slabShift: uint32(bits.TrailingZeros(uint(count))), slabMask: uint32(count - 1),
			mapBytes: mapBytes,
			shards:   make([]shard, cfg.Shards), shardMask: uint32(cfg.Shards - 1),
			slabs:     make([]atomic.Pointer[slab], maxSlabs),
			exhausted: &ExhaustedError{Size: size, ClassCap: capBytes, PoolCap: cfg.MaxBytes},
			wake:      make(chan struct{}),
		}
		p.classes = append(p.classes, c)
	}
	p.warnMemlock()
	for _, c := range p.classes {
		for range cfg.Prealloc {
			c.mu.Lock()
			s, err := c.grow(0)
			if err == nil {
				c.pushChain(&c.shards[0], s, s, 0)
			}
			c.mu.Unlock()
			if err != nil {
				return nil, errors.Join(err, p.Close())
			}
		}
	}
	return p, nil
}

// Classes returns the buffer sizes of the pool's classes, ascending.
func (p *Pool) Classes() []int {
	out := make([]int, len(p.classes))
	for i, c := range p.classes {
		out[i] = c.size
	}
	return out
}

// classFor returns the smallest class that holds n bytes.
func (p *Pool) classFor(n int) (*class, error) {
	if uint(n) <= uint(p.minSize) {
		return p.classes[0], nil
	}
	if uint(n) > uint(p.maxSize) { // too large, or negative
		if n < 0 {
			return nil, fmt.Errorf("pool: get %d bytes: %w", n, verbs.ErrInvalid)
		}
		return nil, fmt.Errorf("pool: get %d bytes: %w (%s)", n, ErrTooLarge, sizeString(int64(p.maxSize)))
	}
	if p.pow2 {
		return p.classes[bits.Len(uint(n-1))-p.minShift], nil
	}
	lo, hi := 1, len(p.classes)-1 // classes[hi] holds n, classes[0] does not
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p.classes[m].size >= n {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return p.classes[lo], nil
}

// hint returns a per-goroutine number for picking a shard: the address of a local
// variable, which lies in the calling goroutine's stack, in 2 KiB units (the smallest
// stack), xor-folded so that its low bits depend on the higher ones too. Stacks of
// different goroutines are disjoint, so goroutines that run in parallel tend to use
// different shards: neighbouring stacks, which goroutines started together get, differ in
// their low bits. A goroutine whose stack moves just gets another shard.
func hint() uint32 {
	var x byte
	h := uint32(uintptr(unsafe.Pointer(&x)) >> 11)
	h ^= h >> 8
	h ^= h >> 4
	return h
}

// Get returns a buffer of n bytes (Bytes has length n and the capacity of its class). If
// the class is exhausted and at its cap, Get waits until a buffer of the class is released
// or ctx ends; then the error matches both ErrPoolExhausted and ctx.Err(). (Slabs are not
// given back before Close, so a class whose growth the pool cap stopped waits for its own
// buffers only.) A Get of more than the largest class fails with ErrTooLarge.
//
// The buffer is the caller's until Release.
func (p *Pool) Get(ctx context.Context, n int) (*Buf, error) {
	c, err := p.classFor(n)
	if err != nil {
		return nil, err
	}
	home := hint() & c.shardMask
	if !p.closed.Load() {
		if s, st := c.pop(&c.shards[home]); s != nil {
			return c.take(s, st, n, home), nil
		}
	}
	return c.getSlow(ctx, n, home, true)
}

// TryGet is Get without waiting: when the class is exhausted and at its cap it fails at
// once with an error matching ErrPoolExhausted.
func (p *Pool) TryGet(n int) (*Buf, error) {
	c, err := p.classFor(n)
	if err != nil {
		return nil, err
	}
	home := hint() & c.shardMask
	if !p.closed.Load() {
		if s, st := c.pop(&c.shards[home]); s != nil {
			return c.take(s, st, n, home), nil
		}
	}
	return c.getSlow(context.Background(), n, home, false)
}

// getSlow takes a buffer from another shard, grows the class, or waits (if wait).
func (c *class) getSlow(ctx context.Context, n int, home uint32, wait bool) (*Buf, error) {
	waited := false
	for {
		if c.p.closed.Load() {
			return nil, fmt.Errorf("pool: get: %w", ErrClosed)
		}
		if s, st := c.steal(home); s != nil {
			return c.take(s, st, n, home), nil
		}
		c.mu.Lock()
		if c.p.closed.Load() {
			c.mu.Unlock()
			continue
		}
		if s, st := c.steal(home); s != nil { // another goroutine grew the class
			c.mu.Unlock()
			return c.take(s, st, n, home), nil
		}
		s, err := c.grow(home)
		if err == nil {
			c.mu.Unlock()
			return c.take(s, 0, n, home), nil
		}
		if !errors.Is(err, ErrPoolExhausted) || !wait {
			c.mu.Unlock()
			if err == c.exhausted {
				c.failed.Add(1)
			}
			return nil, err
		}
		// Wait for a Release. Register first, then look once more: a Release that pushed
		// before our registration is seen by the look, one after it sees the registration
		// and closes the channel we hold (see Release).
		c.waiters.Add(1)
		ch := c.wake
		c.mu.Unlock()
		if !waited {
			waited = true
			c.waits.Add(1)
		}
		if s, st := c.steal(home); s != nil {
			c.waiters.Add(-1)
			return c.take(s, st, n, home), nil
		}
		select {
		case <-ch:
			c.waiters.Add(-1)
		case <-ctx.Done():
			c.waiters.Add(-1)
			c.failed.Add(1)
			return nil, fmt.Errorf("%w: %w", c.exhausted, context.Cause(ctx))
		}
	}
}

// steal pops from the first non-empty shard, starting at home.
func (c *class) steal(home uint32) (*slot, uint32) {
	for i := range uint32(len(c.shards)) {
		sh := &c.shards[(home+i)&c.shardMask]
		if uint32(sh.head.Load()) == 0 {
			continue
		}
		if s, st := c.pop(sh); s != nil {
			return s, st
		}
	}
	return nil, 0
}

// take hands slot s, popped in state st, out as a buffer of n bytes whose home shard is
// home.
func (c *class) take(s *slot, st uint32, n int, home uint32) *Buf {
	if st&1 != 0 {
		panic(&MisuseError{Op: "Get", What: "pool corrupted: a buffer on the free list is in use", Buf: s.describe()})
	}
	if debug {
		if err := checkPoison(s); err != nil {
			fill(s.bytes(), poisonByte) // keep the pool usable: repair and put the slot back
			c.pushChain(&c.shards[home], s, s, st)
			panic(err)
		}
	}
	st += 3 // next generation, in use
	s.word.Store(slotWord(st, 0))
	s.home = home
	var b *Buf
	if debug {
		b = &Buf{s: s}
	} else {
		b = &s.h
	}
	b.n, b.off = uint32(n), 0
	b.want = st
	if c.p.cfg.TrackLeaks {
		s.taken.Store(newGetRecord(n))
	}
	return b
}

// wakeWaiters wakes the Gets waiting for a buffer of c, after a Release.
func (c *class) wakeWaiters() {
	c.mu.Lock()
	close(c.wake)
	c.wake = make(chan struct{})
	c.mu.Unlock()
}

// grow registers one more slab, pushes all its slots but the first onto shard home and
// returns the first. c.mu must be held. At the class or pool cap it returns c.exhausted.
func (c *class) grow(home uint32) (*slot, error) {
	no := int(c.nslabs.Load())
	if no >= len(c.slabs) {
		return nil, c.exhausted
	}
	p := c.p
	want := int64(c.mapBytes)
	for {
		cur := p.registered.Load()
		if cur+want > p.cfg.MaxBytes {
			return nil, c.exhausted
		}
		if p.registered.CompareAndSwap(cur, cur+want) {
			break
		}
	}
	sl, err := p.newSlab(c, no)
	if err != nil {
		p.registered.Add(-want)
		return nil, err
	}
	c.slabs[no].Store(sl)
	c.nslabs.Store(int32(no + 1))
	if len(sl.slots) > 1 {
		c.pushChain(&c.shards[home], &sl.slots[1], &sl.slots[len(sl.slots)-1], 0)
	}
	return &sl.slots[0], nil
}

// newSlab maps, locks (if configured) and registers slab number no of class c.
func (p *Pool) newSlab(c *class, no int) (*slab, error) {
	want := int64(c.mapBytes)
	lim, err := p.reservePinned(c, want)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			pinned.Add(-want)
		}
	}()
	mem, err := p.mapSlab(c)
	if err != nil {
		if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EAGAIN) {
			return nil, p.memlockError(c, lim, err)
		}
		return nil, fmt.Errorf("pool: map %s slab for class %s: %w", sizeString(want), sizeString(int64(c.size)), err)
	}
	sl := &slab{c: c, no: no, mem: mem}
	unmap := func() {
		if sl.locked {
			_ = unlockMemory(mem.Bytes())
		}
		_ = mem.Unmap()
	}
	if p.cfg.Lock {
		if err := lockMemory(mem.Bytes()); err != nil {
			unmap()
			return nil, p.memlockError(c, lim, fmt.Errorf("%s: %w", lockCall, err))
		}
		sl.locked = true
	}
	used := mem.Bytes()[:c.count*c.size]
	if debug {
		fill(used, poisonByte)
	}
	mr, err := p.pd.RegMR(used, p.cfg.Access)
	if err != nil {
		unmap()
		if errors.Is(err, verbs.ErrNoMemory) {
			return nil, p.memlockError(c, lim, err)
		}
		return nil, fmt.Errorf("pool: register %s slab for class %s (access %v): %w", sizeString(want), sizeString(int64(c.size)), p.cfg.Access, err)
	}
	sl.mr, sl.lkey, sl.rkey = mr, mr.LKey(), mr.RKey()
	sl.slots = make([]slot, c.count)
	for i := range sl.slots {
		s := &sl.slots[i]
		s.ref = uint32(no*c.count+i) + 1
		s.slab = sl
		s.ptr = unsafe.Pointer(&used[i*c.size])
		s.size = uint32(c.size)
		s.h.s = s
		if i+1 < len(sl.slots) {
			s.word.Store(slotWord(0, s.ref+1)) // chain the slab's slots for one push
		}
	}
	ok = true
	return sl, nil
}

// mapSlab maps a slab for c, on huge pages if configured and available. Slabs are shared
// mappings (a sealed memfd on Linux): over the shm fabric the peer maps them and places
// READs straight into them (one copy); elsewhere they are ordinary memory.
func (p *Pool) mapSlab(c *class) (*verbs.Memory, error) {
	if p.cfg.HugePages {
		mem, err := verbs.Map(c.mapBytes, verbs.MapOptions{HugePages: true, Shared: true})
		if err == nil {
			c.hugeSlabs++
			return mem, nil
		}
		if p.hugeWarned.CompareAndSwap(false, true) {
			p.cfg.Logger.Warn("pool: huge pages unavailable, falling back to normal pages ("+hugePagesHint+")",
				"slab", sizeString(int64(c.mapBytes)), "err", err)
		}
	}
	return verbs.Map(c.mapBytes, verbs.MapOptions{Shared: true})
}

// Close deregisters and unmaps every slab and fails later Gets with ErrClosed. Buffers
// still out are leaks: Close reports them (an error matching ErrLeaked, with the stacks
// that took them when leak tracking is on), deregisters their slabs when it can, and leaves
// those slabs mapped for good, so that a late access is not a fault. Close the Windows
// bound over the pool's buffers first: a region with a window bound cannot be
// deregistered.
func (p *Pool) Close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("pool: close: %w", ErrClosed)
	}
	var errs []error
	if leaks := p.Outstanding(); len(leaks) > 0 {
		errs = append(errs, &LeakError{Leaks: leaks})
	}
	for _, c := range p.classes {
		c.mu.Lock()
		close(c.wake) // waiters see closed
		c.wake = make(chan struct{})
		// Take every free buffer off the free lists, so a racing Get cannot have it; a
		// slab whose buffers all came back is unused.
		nslabs := int(c.nslabs.Load())
		free := make([]int, nslabs)
		for i := range c.shards {
			for s, _ := c.pop(&c.shards[i]); s != nil; s, _ = c.pop(&c.shards[i]) {
				free[s.slab.no]++
			}
		}
		for no := range nslabs {
			sl := c.slabs[no].Load()
			if err := sl.mr.Dereg(); err != nil {
				errs = append(errs, fmt.Errorf("pool: deregister %s slab %d of class %s: %w",
					sizeString(int64(c.mapBytes)), no, sizeString(int64(c.size)), err))
				continue
			}
			pinned.Add(-int64(c.mapBytes))
			p.registered.Add(-int64(c.mapBytes))
			if free[no] != c.count {
				continue // leaked buffers: keep the memory mapped
			}
			if sl.locked {
				_ = unlockMemory(sl.mem.Bytes())
			}
			if err := sl.mem.Unmap(); err != nil {
				errs = append(errs, fmt.Errorf("pool: unmap slab %d of class %s: %w", no, sizeString(int64(c.size)), err))
			}
		}
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Stats is a snapshot of a pool's counters.
type Stats struct {
	Classes         []ClassStats
	RegisteredBytes int64 // bytes of memory this pool has registered
	// ProcessRegisteredBytes is what all pools of the process have registered: what the
	// pools count against RLIMIT_MEMLOCK.
	ProcessRegisteredBytes int64
}

// ClassStats are the counters of one class.
type ClassStats struct {
	Size       int    // buffer size
	Slabs      int    // slabs registered
	HugeSlabs  int    // of which on huge pages
	Buffers    int    // buffers in those slabs
	InUse      int    // buffers handed out and not yet released
	BytesInUse int64  // InUse * Size: registered bytes held by users
	Waits      uint64 // Gets that waited for a Release
	Exhausted  uint64 // TryGets that failed, and Gets whose context ended waiting
}

// Stats returns a snapshot of the pool's counters. The fast path of Get and Release
// keeps no counters (each would be another atomic operation on a shared cache line), so
// Stats reads the state of every buffer: its cost grows with the pool (about a
// nanosecond per buffer), and under load the figures are approximate.
func (p *Pool) Stats() Stats {
	st := Stats{
		Classes:                make([]ClassStats, len(p.classes)),
		RegisteredBytes:        p.registered.Load(),
		ProcessRegisteredBytes: pinned.Load(),
	}
	for i, c := range p.classes {
		cs := &st.Classes[i]
		cs.Size = c.size
		cs.Slabs = int(c.nslabs.Load())
		cs.Buffers = cs.Slabs * c.count
		for no := range cs.Slabs {
			sl := c.slabs[no].Load()
			for j := range sl.slots {
				cs.InUse += int(wordState(sl.slots[j].word.Load()) & 1)
			}
		}
		cs.BytesInUse = int64(cs.InUse) * int64(c.size)
		cs.Waits = c.waits.Load()
		cs.Exhausted = c.failed.Load()
		c.mu.Lock()
		cs.HugeSlabs = c.hugeSlabs
		c.mu.Unlock()
	}
	return st
}

// sizeString formats a byte count: "256 B", "4 KiB", "1.5 MiB".
func sizeString(n int64) string {
	const units = "KMGTPE"
	if n < 1024 && n > -1024 {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	i := -1
	for (f >= 1024 || f <= -1024) && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d %ciB", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}
