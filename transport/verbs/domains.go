package verbs

import (
	"errors"
	"fmt"
)

// TD is a thread domain (ibv_alloc_td(3)): a promise by the application that the objects
// created in a parent domain carrying it are used by one thread at a time, never by two
// at once, so that the provider may drop the locks that guard them (mlx5 does: its
// doorbells and queue buffers go unlocked). Using them from two goroutines at once is a
// bug in the application; the soft provider catches it under the race detector or with
// the mwrpcdebug build tag.
type TD interface {
	// Dealloc releases the thread domain (ibv_dealloc_td). A parent domain that carries
	// it must be deallocated first (ErrBusy).
	Dealloc() error
}

// ParentDomainAttr describes a parent domain (struct ibv_parent_domain_init_attr): the
// protection domain its objects belong to and, optionally, a thread domain.
type ParentDomainAttr struct {
	// PD is the protection domain; it is required. Protection checks (a window bound to
	// a QP of the same PD, an lkey of the same PD) see the parent domain's objects as
	// this PD's.
	PD PD
	// TD, if not nil, is the thread domain the parent domain's objects are used in.
	TD TD
	// Allocator, if not nil, gives the provider the memory of the buffers it allocates
	// for the parent domain's objects (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS); nil
	// leaves them all to the provider.
	Allocator Allocator
}

// ResourceType says what a provider buffer is for: the resource_type argument of
// ibv_parent_domain_init_attr's alloc and free. Its values are the provider's (mlx5dv:
// MLX5DV_RES_TYPE_QP, _DBR, _SRQ, _CQ; soft: soft.ResDoorbell).
type ResourceType uint64

// ErrUseDefault, returned by Allocator.Alloc, has the provider allocate that buffer
// itself (IBV_ALLOCATOR_USE_DEFAULT).
var ErrUseDefault = errors.New("verbs: allocator: use the provider's default")

// Allocator is a parent domain's custom allocator (ibv_alloc_parent_domain(3)): the
// provider asks it for the buffers of the objects created on the parent domain (queue
// rings, doorbell records) instead of allocating them itself, so that the application
// chooses where they live (huge pages, a NUMA node, memory it already registered).
//
// The provider calls Alloc and Free on the goroutine that creates or destroys the object
// (inside the verb: ibv calls them from C, through cgo), so they must not block for long
// nor call verbs on the object being created. The provider zeroes what Alloc returns
// before use and never copies out of it: the object's buffer is that memory until Free.
type Allocator interface {
	// Alloc returns size bytes aligned to alignment (a power of two) for a buffer of
	// type typ; ErrUseDefault has the provider allocate it itself, any other error fails
	// the verb (ENOMEM).
	Alloc(size, alignment int, typ ResourceType) ([]byte, error)
	// Free gives back a buffer Alloc returned, with the same type, once the object it
	// was for is destroyed.
	Free(buf []byte, typ ResourceType)
}

// ThreadDomains is implemented by devices that have thread domains and parent domains
// (ibv_alloc_td(3), ibv_alloc_parent_domain(3)). Use AllocTD and AllocParentDomain.
type ThreadDomains interface {
	Device
	// AllocTD allocates a thread domain.
	AllocTD() (TD, error)
	// AllocParentDomain allocates a parent domain: a PD that is accepted wherever a PD
	// is (RegMR, AllocMW, CreateQP, CreateSRQ), whose objects belong to attr.PD and to
	// attr.TD's thread. Dealloc releases it; it fails with ErrBusy while objects created
	// on it remain, and attr.PD and attr.TD stay busy while it exists.
	AllocParentDomain(attr ParentDomainAttr) (PD, error)
}

// AllocTD allocates a thread domain on dev, or fails with ErrUnsupported where the
// provider or the device has none.
func AllocTD(dev Device) (TD, error) {
	d, ok := dev.(ThreadDomains)
	if !ok {
		return nil, fmt.Errorf("verbs: alloc TD: %s has no thread domains: %w", dev.Name(), ErrUnsupported)
	}
	return d.AllocTD()
}

// AllocParentDomain allocates a parent domain on dev, or fails with ErrUnsupported where
// the provider or the device has none (a caller then uses attr.PD itself), or with
// ErrInvalid when attr.PD is nil.
func AllocParentDomain(dev Device, attr ParentDomainAttr) (PD, error) {
	if attr.PD == nil {
		return nil, fmt.Errorf("verbs: alloc parent domain: no PD: %w", ErrInvalid)
	}
	d, ok := dev.(ThreadDomains)
	if !ok {
		return nil, fmt.Errorf("verbs: alloc parent domain: %s has no parent domains: %w", dev.Name(), ErrUnsupported)
	}
	return d.AllocParentDomain(attr)
}
