package verbs

import "fmt"

// SGE is one scatter/gather element: Length bytes at virtual address Addr inside the memory
// region whose lkey is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// MWBind describes the binding a BIND_MW work request (or a type-1 MW.Bind) creates.
type MWBind struct {
	MW MW // the window to bind
	// RKey is the window's rkey after the bind. Its index bits must name MW (a key of
	// another object fails with MW_BIND_ERR, as a stale key does on rxe); its low 8 bits
	// are the caller's choice: IncRkey of the current rkey, so that every old rkey of the
	// window stops working (for 255 more binds).
	RKey   uint32
	MR     MR     // the region the window lies in; it must have AccessMWBind
	Addr   uint64 // start of the window (a virtual address of MR, or an offset if ZeroBased)
	Length uint64 // length of the window; 0 is refused with MW_BIND_ERR
	Access Access // the rights the window grants: AccessRemoteRead, AccessRemoteWrite, ...
}

// SendWR is a send work request (ibv_send_wr). Which fields matter depends on Opcode:
//
//	SEND, SEND_WITH_IMM, SEND_WITH_INV: SGL (or inline data), ImmData, InvalidateRKey
//	RDMA_WRITE[_WITH_IMM], RDMA_READ:   SGL, RemoteAddr, RKey (and ImmData)
//	BIND_MW:                             Bind
//	LOCAL_INV:                           InvalidateRKey
//
// The provider copies the request at post time; the caller may reuse it (and its SGL slice)
// once PostSend returns. The memory the SGL names stays the NIC's until completion.
type SendWR struct {
	WRID           uint64
	Opcode         WROpcode
	Flags          SendFlags
	SGL            []SGE
	ImmData        uint32 // SEND_WITH_IMM, RDMA_WRITE_WITH_IMM
	InvalidateRKey uint32 // SEND_WITH_INV, LOCAL_INV
	RemoteAddr     uint64 // RDMA_READ, RDMA_WRITE
	RKey           uint32 // RDMA_READ, RDMA_WRITE
	Bind           MWBind // BIND_MW
}

// RecvWR is a receive work request (ibv_recv_wr): where the next incoming SEND lands.
type RecvWR struct {
	WRID uint64
	SGL  []SGE
}

// WorkCompletion reports the outcome of one work request (ibv_wc). Only WRID, Status and
// QPNum are defined when Status is not WCSuccess.
type WorkCompletion struct {
	WRID            uint64
	Status          WCStatus
	Opcode          WCOpcode
	Flags           WCFlags
	ByteLen         uint32 // bytes received (receives) or read (RDMA_READ)
	ImmData         uint32 // valid with WCWithImm
	InvalidatedRKey uint32 // valid with WCWithInv
	QPNum           uint32 // the local QP the work request was posted on
	VendorErr       uint32 // provider-specific detail for an error status
}

// String formats the completion for logs and test failures.
func (wc WorkCompletion) String() string {
	s := fmt.Sprintf("wc{wrid=%d qp=%d %s %s len=%d", wc.WRID, wc.QPNum, wc.Opcode, wc.Status, wc.ByteLen)
	if wc.Flags&WCWithImm != 0 {
		s += fmt.Sprintf(" imm=0x%x", wc.ImmData)
	}
	if wc.Flags&WCWithInv != 0 {
		s += fmt.Sprintf(" inv=0x%x", wc.InvalidatedRKey)
	}
	return s + "}"
}
