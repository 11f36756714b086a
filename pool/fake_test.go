package pool

import (
	"fmt"
	"sync"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// fakePD is a protection domain that only registers memory (pinning it with verbs.Pin,
// as providers do) and allocates windows; it stands in for a provider in unit tests.
type fakePD struct {
	mu       sync.Mutex
	nextKey  uint32
	mrs      map[*fakeMR]bool
	mws      int
	failRegs error // if set, RegMR fails with it
}

func newFakePD() *fakePD { return &fakePD{nextKey: 1, mrs: map[*fakeMR]bool{}} }

func (pd *fakePD) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.failRegs != nil {
		return nil, pd.failRegs
	}
	mem, err := verbs.Pin(buf)
	if err != nil {
		return nil, err
	}
	k := verbs.MakeKey(pd.nextKey, 0x11)
	pd.nextKey++
	mr := &fakeMR{pd: pd, mem: mem, buf: buf, key: k, access: access}
	pd.mrs[mr] = true
	return mr, nil
}

func (pd *fakePD) AllocMW(t verbs.MWType) (verbs.MW, error) {
	if t != verbs.MWType2 {
		return nil, fmt.Errorf("fake: mw type %v: %w", t, verbs.ErrUnsupported)
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	k := verbs.MakeKey(pd.nextKey, 0xfe) // close to wrapping, to exercise IncRkey
	pd.nextKey++
	pd.mws++
	return &fakeMW{pd: pd, key: k}, nil
}

func (pd *fakePD) CreateQP(verbs.QPInitAttr) (verbs.QP, error) {
	return &fakeQP{pd: pd, num: 7}, nil
}

func (pd *fakePD) Dealloc() error { return nil }

// live returns the number of registered regions and allocated windows.
func (pd *fakePD) live() (mrs, mws int) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	return len(pd.mrs), pd.mws
}

type fakeMR struct {
	pd     *fakePD
	mem    *verbs.Memory
	buf    []byte
	key    uint32
	access verbs.Access
}

func (m *fakeMR) LKey() uint32         { return m.key }
func (m *fakeMR) RKey() uint32         { return m.key }
func (m *fakeMR) Addr() uint64         { return verbs.AddrOf(m.buf) }
func (m *fakeMR) Bytes() []byte        { return m.buf }
func (m *fakeMR) Access() verbs.Access { return m.access }
func (m *fakeMR) Dereg() error {
	m.pd.mu.Lock()
	defer m.pd.mu.Unlock()
	if !m.pd.mrs[m] {
		return verbs.ErrClosed
	}
	delete(m.pd.mrs, m)
	m.mem.Unpin()
	return nil
}

type fakeMW struct {
	pd   *fakePD
	key  uint32
	dead bool
}

func (w *fakeMW) Type() verbs.MWType { return verbs.MWType2 }
func (w *fakeMW) RKey() uint32       { return w.key }
func (w *fakeMW) Bind(verbs.QP, uint64, verbs.SendFlags, verbs.MWBind) (uint32, error) {
	return 0, verbs.ErrInvalid
}
func (w *fakeMW) Dealloc() error {
	w.pd.mu.Lock()
	defer w.pd.mu.Unlock()
	if w.dead {
		return verbs.ErrClosed
	}
	w.dead = true
	w.pd.mws--
	return nil
}

// fakeQP is enough of a QP for Windows, which only asks its PD and number.
type fakeQP struct {
	verbs.QP // nil: any other method panics
	pd       verbs.PD
	num      uint32
}

func (q *fakeQP) PD() verbs.PD { return q.pd }
func (q *fakeQP) Num() uint32  { return q.num }
