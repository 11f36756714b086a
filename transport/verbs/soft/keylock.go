package soft

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// keyLock is the key table's reader-writer lock, in stripes: a key check (several per
// call: the SEND's gather and the receive's scatter on each side, a READ's or WRITE's
// target) read-locks the stripe of its QP (QP.stripe); a writer (a registration, a bind,
// an invalidation: once per region, once per large message) locks them all, in order.
// One lock's reader count is a cache line that every key check of every connection of
// the process writes twice; with the QPs' checks spread over stripes, the calls of
// connections served on different cores stop trading it.
type keyLock struct {
	_       [cacheLine]byte // off the lines of the fields before it, which readers share
	stripes [statStripes]paddedRW
}

type paddedRW struct {
	sync.RWMutex
	_ [cacheLine - unsafe.Sizeof(sync.RWMutex{})]byte
}

// rlock locks stripe i for reading.
func (l *keyLock) rlock(i uint32) { l.stripes[i].RLock() }

// runlock undoes rlock(i).
func (l *keyLock) runlock(i uint32) { l.stripes[i].RUnlock() }

// Lock locks every stripe for writing.
func (l *keyLock) Lock() {
	for i := range l.stripes {
		l.stripes[i].Lock()
	}
}

// Unlock undoes Lock.
func (l *keyLock) Unlock() {
	for i := range l.stripes {
		l.stripes[i].Unlock()
	}
}

// transfers counts a region's transfers in progress, in stripes as keyLock: a transfer
// counts itself in and out in its QP's stripe, so that the transfers of connections on
// different cores do not write one line. A stripe alone means nothing (a reference one
// QP took another may drop), only the sum does.
type transfers struct {
	_       [cacheLine]byte // off the lines of the region's fields before it, which every key check reads
	stripes [statStripes]paddedCount
}

type paddedCount struct {
	atomic.Int64
	_ [cacheLine - unsafe.Sizeof(atomic.Int64{})]byte
}

func (t *transfers) add(i uint32, d int64) { t.stripes[i].Add(d) }

// sum adds the stripes up, one after another. While the count can only fall (the region
// is invalid: no key check admits a new transfer, and a transfer that adds a reference
// without one adds it in the stripe of the reference that keeps the region valid), a sum
// is at least the count when it returns, so that 0 means no transfer is left.
func (t *transfers) sum() int64 {
	var n int64
	for i := range t.stripes {
		n += t.stripes[i].Load()
	}
	return n
}
