package soft

import (
	"encoding/binary"
	"errors"
	"testing"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// fixedAllocator hands out the buffers it is given, in order, and records what comes back.
type fixedAllocator struct {
	bufs  [][]byte
	types []verbs.ResourceType // of each Alloc
	freed []verbs.ResourceType
}

func (a *fixedAllocator) Alloc(size, alignment int, typ verbs.ResourceType) ([]byte, error) {
	a.types = append(a.types, typ)
	if len(a.bufs) == 0 {
		return nil, errors.New("no buffer left")
	}
	b := a.bufs[0]
	a.bufs = a.bufs[1:]
	return b, nil
}

func (a *fixedAllocator) Free(buf []byte, typ verbs.ResourceType) { a.freed = append(a.freed, typ) }

// aligned returns n bytes of 0xff at a DoorbellAlign boundary, plus off.
func aligned(n, off int) []byte {
	raw := make([]byte, n+2*DoorbellAlign)
	i := DoorbellAlign - int(uintptr(unsafe.Pointer(&raw[0]))%DoorbellAlign)
	b := raw[i+off : i+off+n]
	for j := range b {
		b[j] = 0xff
	}
	return b
}

// TestDoorbellRecord: the soft provider asks a parent domain's allocator for a QP's and an
// SRQ's doorbell record (its resource types), zeroes what it gets, writes the queue tails
// there at every post, and gives each back with its type when the object is destroyed;
// memory too short or misaligned is given back and fails the verb (EINVAL).
func TestDoorbellRecord(t *testing.T) {
	d := mustOpen(t)
	defer d.Close()
	pd, _ := d.AllocPD()
	defer pd.Dealloc()
	cq, _ := d.CreateCQ(64)
	defer cq.Destroy()
	a := &fixedAllocator{bufs: [][]byte{aligned(DoorbellSize, 0), aligned(DoorbellSize, 0), aligned(DoorbellSize, 8), aligned(8, 0)}}
	pdom, err := verbs.AllocParentDomain(d, verbs.ParentDomainAttr{PD: pd, Allocator: a})
	if err != nil {
		t.Fatal(err)
	}
	qpDB, srqDB := a.bufs[0], a.bufs[1]
	qp, err := pdom.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	srq, err := verbs.CreateSRQ(pdom, verbs.SRQAttr{MaxWR: 8, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{qpDB, srqDB} {
		for i, v := range b {
			if v != 0 {
				t.Fatalf("doorbell byte %d is %#x after create: want the provider to zero it", i, v)
			}
		}
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPStateInit}); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv([]verbs.RecvWR{{WRID: 1}, {WRID: 2}, {WRID: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := srq.PostRecv([]verbs.RecvWR{{WRID: 1}, {WRID: 2}}); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(qpDB[8:]); got != 3 {
		t.Errorf("QP doorbell receive tail = %d, want 3", got)
	}
	if got := binary.LittleEndian.Uint64(srqDB[8:]); got != 2 {
		t.Errorf("SRQ doorbell tail = %d, want 2", got)
	}
	for _, tc := range []struct {
		what string
	}{{"misaligned"}, {"too short"}} {
		_, err := pdom.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("create QP with %s doorbell memory: %v, want EINVAL", tc.what, err)
		}
	}
	if err := pdom.Dealloc(); !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("dealloc of the parent domain with a QP and an SRQ: %v, want EBUSY", err)
	}
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := srq.Destroy(); err != nil {
		t.Fatal(err)
	}
	want := []verbs.ResourceType{ResQPDoorbell, ResSRQDoorbell, ResQPDoorbell, ResQPDoorbell}
	if len(a.types) != len(want) || a.types[0] != want[0] || a.types[1] != want[1] {
		t.Errorf("allocs with types %v, want %v", a.types, want)
	}
	// The two refused buffers, then the QP's and the SRQ's.
	if wantFreed := []verbs.ResourceType{ResQPDoorbell, ResQPDoorbell, ResQPDoorbell, ResSRQDoorbell}; len(a.freed) != 4 ||
		a.freed[2] != wantFreed[2] || a.freed[3] != wantFreed[3] {
		t.Errorf("frees with types %v, want %v", a.freed, wantFreed)
	}
	if err := pdom.Dealloc(); err != nil {
		t.Errorf("dealloc of the empty parent domain: %v", err)
	}
}
