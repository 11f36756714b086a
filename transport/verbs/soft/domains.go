package soft

import (
	"fmt"
	"sync/atomic"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// td is a thread domain (verbs.TD). The soft NIC keeps the locks of a thread domain's
// objects, since its engine and stream-reader goroutines share them with the poster, and
// checks the contract instead: every post to one of its QPs or SRQs writes posts without
// synchronization, so that two goroutines posting at once are a data race the race
// detector reports, and counts overlapping posts in misuse (a panic with the mwrpcdebug
// build tag).
type td struct {
	dev   *Device
	users verbs.Users // parent domains that carry it

	posts  int          // written by every post, unsynchronized on purpose (see above)
	inPost atomic.Int32 // posts running now
	misuse atomic.Int64 // posts that overlapped another
}

// AllocTD implements verbs.ThreadDomains.
func (d *Device) AllocTD() (verbs.TD, error) {
	if err := d.use(); err != nil {
		return nil, err
	}
	return &td{dev: d}, nil
}

// Dealloc releases the thread domain; it fails with ErrBusy while a parent domain carries
// it.
func (t *td) Dealloc() error {
	if err := t.users.Close("soft: dealloc TD", "parent domains", nil); err != nil {
		return err
	}
	t.dev.unuse()
	return nil
}

func (t *td) enter() {
	t.posts++
	if t.inPost.Add(1) > 1 {
		t.misuse.Add(1)
		if debugThreadDomains {
			panic("soft: two goroutines post at once to objects of one thread domain (verbs.TD)")
		}
	}
}

func (t *td) exit() { t.inPost.Add(-1) }

// parentDomain is a parent domain (verbs.ThreadDomains.AllocParentDomain): a PD whose
// objects belong, for every protection check, to the PD it was made from (root), and to
// its thread domain, if any. It counts them, so that it cannot be deallocated under them.
type parentDomain struct {
	root  *pd
	td    *td             // nil: none
	alloc verbs.Allocator // nil: none; its objects' doorbell records come from it
	users verbs.Users
}

// AllocParentDomain implements verbs.ThreadDomains: a.PD must be a PD (not a parent
// domain) of this device, a.TD nil or a thread domain of this device.
func (d *Device) AllocParentDomain(a verbs.ParentDomainAttr) (verbs.PD, error) {
	root, ok := a.PD.(*pd)
	if !ok || root == nil || root.dev != d {
		return nil, fmt.Errorf("soft: alloc parent domain: the PD must be a protection domain of device %s: %w", d.name, verbs.ErrInvalid)
	}
	var t *td
	if a.TD != nil {
		if t, ok = a.TD.(*td); !ok || t == nil || t.dev != d {
			return nil, fmt.Errorf("soft: alloc parent domain: the TD must be a thread domain of device %s: %w", d.name, verbs.ErrInvalid)
		}
	}
	if err := root.use(); err != nil {
		return nil, err
	}
	if t != nil {
		if err := t.users.Acquire("soft: alloc parent domain: TD"); err != nil {
			root.unuse()
			return nil, err
		}
	}
	return &parentDomain{root: root, td: t, alloc: a.Allocator}, nil
}

// Dealloc releases the parent domain, and with it its hold on its PD and TD; it fails
// with ErrBusy while objects created on it remain.
func (p *parentDomain) Dealloc() error {
	return p.users.Close("soft: dealloc parent domain", "MRs, MWs, QPs or SRQs", func() error {
		if p.td != nil {
			p.td.users.Release()
		}
		p.root.unuse()
		return nil
	})
}

// release drops an object created on p; p may be nil (the object was made on a PD).
func (p *parentDomain) release() {
	if p != nil {
		p.users.Release()
	}
}

// RegMR registers buf in the parent domain's PD, counted by the parent domain.
func (p *parentDomain) RegMR(buf []byte, access verbs.Access) (verbs.MR, error) {
	if err := p.users.Acquire("soft: reg MR on a parent domain"); err != nil {
		return nil, err
	}
	m, err := p.root.RegMR(buf, access)
	if err != nil {
		p.users.Release()
		return nil, err
	}
	m.(*mr).domain = p
	return m, nil
}

// AllocMW allocates a window in the parent domain's PD, counted by the parent domain.
func (p *parentDomain) AllocMW(t verbs.MWType) (verbs.MW, error) {
	if err := p.users.Acquire("soft: alloc MW on a parent domain"); err != nil {
		return nil, err
	}
	w, err := p.root.AllocMW(t)
	if err != nil {
		p.users.Release()
		return nil, err
	}
	w.(*mw).domain = p
	return w, nil
}

// CreateQP creates a queue pair in the parent domain's PD and thread domain, counted by
// the parent domain. Its SRQ, if any, may be one of the PD's or of a parent domain of it.
func (p *parentDomain) CreateQP(a verbs.QPInitAttr) (verbs.QP, error) {
	if err := p.users.Acquire("soft: create QP on a parent domain"); err != nil {
		return nil, err
	}
	q, err := p.root.CreateQP(a)
	if err != nil {
		p.users.Release()
		return nil, err
	}
	qp := q.(*QP)
	qp.domain, qp.td = p, p.td
	if p.alloc != nil {
		db, err := newDoorbell(p.alloc, ResQPDoorbell)
		if err != nil {
			_ = qp.Destroy()
			return nil, fmt.Errorf("soft: create QP on a parent domain: %w", err)
		}
		qp.mu.Lock()
		qp.db = db
		qp.mu.Unlock()
	}
	return qp, nil
}

// CreateSRQ creates a shared receive queue in the parent domain's PD, counted by the
// parent domain; posts to it are checked against its thread domain.
func (p *parentDomain) CreateSRQ(a verbs.SRQAttr) (verbs.SRQ, error) {
	if err := p.users.Acquire("soft: create SRQ on a parent domain"); err != nil {
		return nil, err
	}
	s, err := p.root.CreateSRQ(a)
	if err != nil {
		p.users.Release()
		return nil, err
	}
	sq := s.(*srq)
	sq.domain = p
	if p.alloc != nil {
		db, err := newDoorbell(p.alloc, ResSRQDoorbell)
		if err != nil {
			_ = sq.Destroy()
			return nil, fmt.Errorf("soft: create SRQ on a parent domain: %w", err)
		}
		sq.mu.Lock()
		sq.db = db
		sq.mu.Unlock()
	}
	return sq, nil
}

var (
	_ verbs.ThreadDomains = (*Device)(nil)
	_ verbs.SRQCreator    = (*parentDomain)(nil)
	_ verbs.CQResizer     = (*cq)(nil)
)
