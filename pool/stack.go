package pool

import "sync/atomic"

// cacheLine is the padding unit that keeps shards from sharing a cache line (128 bytes
// covers the adjacent-line prefetch of x86 and the 128-byte lines of some arm64 parts).
const cacheLine = 128

// shard is one lock-free free list of a class: a Treiber stack of slots.
//
// head packs a 32-bit tag (bumped by every successful CAS, against ABA) above a 32-bit slot
// reference (index in the class plus one; zero for an empty stack). The link to the next
// free slot lives in the low half of each slot's word, next to its state, so that Release
// marks the slot free and links it with one CAS. Slots live until Close, so following a
// reference that a racing pop already took is harmless: the CAS on head then fails on the
// tag.
//
// A Get costs two atomic read-modify-writes (the CAS on head and the store of the slot's
// new state) and a Release two (the CAS on the slot's word and the CAS on head).
type shard struct {
	head atomic.Uint64
	_    [cacheLine - 8]byte
}

// Slot words: the state (generation<<1 | in use) in the high half, the free-list link in
// the low half (zero while the slot is in use).
func slotWord(state, next uint32) uint64 { return uint64(state)<<32 | uint64(next) }
func wordState(w uint64) uint32          { return uint32(w >> 32) }

// pop takes the top slot of sh, or returns nil if sh is empty. It also returns the state
// the slot had on the list.
func (c *class) pop(sh *shard) (*slot, uint32) {
	for {
		old := sh.head.Load()
		ref := uint32(old)
		if ref == 0 {
			return nil, 0
		}
		s := c.slotAt(ref - 1)
		w := s.word.Load()
		if sh.head.CompareAndSwap(old, (old>>32+1)<<32|uint64(uint32(w))) {
			// The tag did not move, so s stayed on top and w is its word.
			return s, wordState(w)
		}
	}
}

// pushChain puts the chain first..last, linked through their words and free, on top of
// sh; last's word gets state lastState.
func (c *class) pushChain(sh *shard, first, last *slot, lastState uint32) {
	for {
		old := sh.head.Load()
		last.word.Store(slotWord(lastState, uint32(old)))
		if sh.head.CompareAndSwap(old, (old>>32+1)<<32|uint64(first.ref)) {
			return
		}
	}
}

// releaseSlot marks s, in use with state want, free and pushes it on its home shard. It
// returns false, changing nothing, if s is not in state want.
func (c *class) releaseSlot(s *slot, want uint32) bool {
	sh := &c.shards[s.home]
	old := sh.head.Load()
	free := want &^ 1
	if !s.word.CompareAndSwap(slotWord(want, 0), slotWord(free, uint32(old))) {
		return false
	}
	for !sh.head.CompareAndSwap(old, (old>>32+1)<<32|uint64(s.ref)) {
		old = sh.head.Load()
		s.word.Store(slotWord(free, uint32(old)))
	}
	return true
}

// slotAt returns the slot with index i in the class. The slot's slab is published before
// any of its slots is pushed, so the load never sees nil for a reference on a free list.
func (c *class) slotAt(i uint32) *slot {
	return &c.slabs[i>>c.slabShift].Load().slots[i&c.slabMask]
}
