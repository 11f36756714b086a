package verbs

import (
	"fmt"
	"strings"
)

// Access is a set of memory and queue-pair access rights (ibv_access_flags). The values are
// libibverbs' own.
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1 << 0 // the NIC may write the memory (receives, READ targets)
	AccessRemoteWrite  Access = 1 << 1 // peers may RDMA WRITE it
	AccessRemoteRead   Access = 1 << 2 // peers may RDMA READ it
	AccessRemoteAtomic Access = 1 << 3 // peers may run atomics on it (modelled, unused)
	AccessMWBind       Access = 1 << 4 // memory windows may be bound over it
	AccessZeroBased    Access = 1 << 5 // remote addresses are offsets from the start
)

var accessNames = []string{"LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ", "REMOTE_ATOMIC", "MW_BIND", "ZERO_BASED"}

// String lists the flags, for example "LOCAL_WRITE|REMOTE_READ".
func (a Access) String() string {
	if a == 0 {
		return "0"
	}
	var parts []string
	for i, n := range accessNames {
		if a&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	if rest := a &^ (1<<len(accessNames) - 1); rest != 0 {
		parts = append(parts, fmt.Sprintf("0x%x", uint32(rest)))
	}
	return strings.Join(parts, "|")
}

// MWType is the type of a memory window.
type MWType uint8

// Memory window types. A type-1 window is bound with MW.Bind and is not tied to a QP; a
// type-2 window is bound by a BIND_MW work request and is usable only through the QP that
// bound it.
const (
	MWType1 MWType = 1
	MWType2 MWType = 2
)

// String returns "type1" or "type2".
func (t MWType) String() string {
	switch t {
	case MWType1:
		return "type1"
	case MWType2:
		return "type2"
	}
	return fmt.Sprintf("MWType(%d)", uint8(t))
}

// QPState is the state of a queue pair.
type QPState uint8

// Queue pair states, in libibverbs order.
const (
	QPStateReset QPState = iota
	QPStateInit
	QPStateRTR
	QPStateRTS
	QPStateSQD
	QPStateSQE
	QPStateError
)

var qpStateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns the libibverbs name of the state.
func (s QPState) String() string {
	if int(s) < len(qpStateNames) {
		return qpStateNames[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// QPType is the transport service of a queue pair.
type QPType uint8

// Queue pair types. Only RC is implemented by the providers; UD exists so that
// RC-only operations can be refused on another type.
const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

// String returns the libibverbs name of the type.
func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// WROpcode is the operation of a send work request (ibv_wr_opcode).
type WROpcode uint8

// Send work request opcodes, with libibverbs' values.
const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
	WRLocalInv         WROpcode = 7
	WRBindMW           WROpcode = 8
	WRSendWithInv      WROpcode = 9
)

// String returns the libibverbs name of the opcode.
func (o WROpcode) String() string {
	switch o {
	case WRRDMAWrite:
		return "RDMA_WRITE"
	case WRRDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSend:
		return "SEND"
	case WRSendWithImm:
		return "SEND_WITH_IMM"
	case WRRDMARead:
		return "RDMA_READ"
	case WRLocalInv:
		return "LOCAL_INV"
	case WRBindMW:
		return "BIND_MW"
	case WRSendWithInv:
		return "SEND_WITH_INV"
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

// SendFlags modify a send work request (ibv_send_flags).
type SendFlags uint8

// Send flags, with libibverbs' values.
const (
	SendFence     SendFlags = 1 << 0 // wait for earlier RDMA READs to complete first
	SendSignaled  SendFlags = 1 << 1 // generate a completion on success
	SendSolicited SendFlags = 1 << 2 // wake a peer waiting for solicited events
	SendInline    SendFlags = 1 << 3 // copy the data at post time (at most MaxInlineData)
)

// WCOpcode is the operation a work completion reports (ibv_wc_opcode).
type WCOpcode uint8

// Work completion opcodes, with libibverbs' values.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
	WCOpcodeUnknown   WCOpcode = 255 // reported on flushed completions, whose opcode is undefined
)

// String returns the libibverbs name of the opcode.
func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// WCStatus is the status of a work completion (ibv_wc_status), with libibverbs' values.
type WCStatus uint8

// Work completion statuses.
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocEECOpErr    WCStatus = 3
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCMWBindErr      WCStatus = 6
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCFatalErr       WCStatus = 19
	WCRespTimeoutErr WCStatus = 20
	WCGeneralErr     WCStatus = 21
)

var wcStatusNames = map[WCStatus]string{
	WCSuccess: "SUCCESS", WCLocLenErr: "LOC_LEN_ERR", WCLocQPOpErr: "LOC_QP_OP_ERR",
	WCLocEECOpErr: "LOC_EEC_OP_ERR", WCLocProtErr: "LOC_PROT_ERR", WCWRFlushErr: "WR_FLUSH_ERR",
	WCMWBindErr: "MW_BIND_ERR", WCBadRespErr: "BAD_RESP_ERR", WCLocAccessErr: "LOC_ACCESS_ERR",
	WCRemInvReqErr: "REM_INV_REQ_ERR", WCRemAccessErr: "REM_ACCESS_ERR", WCRemOpErr: "REM_OP_ERR",
	WCRetryExcErr: "RETRY_EXC_ERR", WCRNRRetryExcErr: "RNR_RETRY_EXC_ERR", WCFatalErr: "FATAL_ERR",
	WCRespTimeoutErr: "RESP_TIMEOUT_ERR", WCGeneralErr: "GENERAL_ERR",
}

// String returns the libibverbs name of the status, for example "REM_ACCESS_ERR".
func (s WCStatus) String() string {
	if n, ok := wcStatusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("WCStatus(%d)", uint8(s))
}

// WCFlags qualify a work completion (ibv_wc_flags), with libibverbs' values.
type WCFlags uint8

// Work completion flags.
const (
	WCWithGRH WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1 // ImmData is valid
	WCWithInv WCFlags = 1 << 3 // InvalidatedRkey is valid: the peer's SEND_WITH_INV revoked it
)
