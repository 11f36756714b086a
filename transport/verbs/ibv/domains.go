//go:build ibverbs && linux && cgo

package ibv

/*
#include <string.h>
#include "mwibv.h"

static struct ibv_td *mwibv_alloc_td(struct ibv_context *ctx) {
	struct ibv_td_init_attr attr;
	memset(&attr, 0, sizeof attr);
	return ibv_alloc_td(ctx, &attr);
}
*/
import "C"

import (
	"fmt"
	"syscall"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// td is a thread domain (ibv_td): with it, a provider that supports it (mlx5) gives the
// parent domain's QPs doorbells and buffers without locks. Soft-RoCE (rxe) has none:
// ibv_alloc_td fails with EOPNOTSUPP (verbs.ErrUnsupported).
type td struct {
	dev   *Device
	c     *C.struct_ibv_td
	users verbs.Users // parent domains
}

// AllocTD implements verbs.ThreadDomains with ibv_alloc_td.
func (d *Device) AllocTD() (verbs.TD, error) {
	if err := d.use(); err != nil {
		return nil, err
	}
	c, err := C.mwibv_alloc_td(d.ctx)
	if c == nil {
		d.unuse()
		return nil, errnoErr(d.name+": alloc TD", cErr(err))
	}
	return &td{dev: d, c: c}, nil
}

// Dealloc releases the thread domain (ibv_dealloc_td); ErrBusy while a parent domain
// carries it.
func (t *td) Dealloc() error {
	err := t.users.Close("ibv: dealloc TD", "parent domains", func() error {
		if rc := C.ibv_dealloc_td(t.c); rc != 0 {
			return errnoErr("dealloc TD", syscall.Errno(rc))
		}
		return nil
	})
	if err != nil {
		return err
	}
	t.dev.unuse()
	return nil
}

// AllocParentDomain implements verbs.ThreadDomains with ibv_alloc_parent_domain: the
// result is a pd whose ibv_pd is the parent domain, accepted wherever a PD is; Dealloc
// (ibv_dealloc_pd) releases it and its hold on a.PD and a.TD.
func (d *Device) AllocParentDomain(a verbs.ParentDomainAttr) (verbs.PD, error) {
	root, ok := a.PD.(*pd)
	if !ok || root == nil || root.dev != d || root.root != nil {
		return nil, fmt.Errorf("ibv: alloc parent domain: the PD must be a protection domain of %s: %w", d.name, verbs.ErrInvalid)
	}
	var t *td
	var tc *C.struct_ibv_td
	if a.TD != nil {
		if t, ok = a.TD.(*td); !ok || t == nil || t.dev != d {
			return nil, fmt.Errorf("ibv: alloc parent domain: the TD must be a thread domain of %s: %w", d.name, verbs.ErrInvalid)
		}
		tc = t.c
	}
	if err := d.use(); err != nil {
		return nil, err
	}
	if err := root.use(); err != nil {
		d.unuse()
		return nil, err
	}
	if t != nil {
		if err := t.users.Acquire("ibv: alloc parent domain: TD"); err != nil {
			root.unuse()
			d.unuse()
			return nil, err
		}
	}
	var pa *parentAlloc
	var h C.uintptr_t
	if a.Allocator != nil {
		pa = newParentAlloc(a.Allocator)
		h = C.uintptr_t(pa.handle)
	}
	c, err := C.mwibv_alloc_parent_domain(d.ctx, root.c, tc, h)
	if c == nil {
		pa.close()
		if t != nil {
			t.users.Release()
		}
		root.unuse()
		d.unuse()
		return nil, errnoErr(d.name+": alloc parent domain", cErr(err))
	}
	return &pd{dev: d, c: c, root: root, td: t, alloc: pa}, nil
}

// protection is the protection domain p's objects belong to: p, or a parent domain's PD.
func (p *pd) protection() *pd {
	if p.root != nil {
		return p.root
	}
	return p
}

var (
	_ verbs.ThreadDomains = (*Device)(nil)
	_ verbs.CQResizer     = (*cq)(nil)
)
