package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The TCP fabric's frame: a fixed 36-byte little-endian header, then Len payload bytes.
//
//	0  op u8        what the frame is (opSend ... opBatch)
//	1  syndrome u8  NAK reason (opNak only)
//	2  flags u16    flagAck: the ack field is valid; flagPlaced (placed.go); flagAckReq: ACK
//	                at once; other bits zero
//	4  psn u32      packet sequence number (24 bits used): one per message
//	8  len u32      payload bytes that follow the header
//	12 imm u32      immediate data (opSendImm, opWriteImm) or the rkey to invalidate (opSendInv)
//	16 rkey u32     remote key (opWrite*, opReadReq)
//	20 raddr u64    remote address (opWrite*, opReadReq); opReadResp: the segment's offset
//	28 rlen u32     bytes to read (opReadReq); bytes placed (placed opReadResp, opWrite)
//	32 ack u32      with flagAck: every message up to this psn was executed (a piggybacked ACK)
//
// A message is one frame, however large: TCP does the segmentation that the MTU does on a
// real fabric. The in-process fabric passes the same header values without encoding them.
//
// A reader takes a frame's header in one read of headerLen+smallMax bytes, so that a small
// frame (at most smallMax payload bytes) costs one read syscall, not two. For that read
// never to take bytes of a larger payload, which go straight from the socket into
// registered memory, a frame with more than smallMax payload bytes carries smallMax bytes
// of zero padding between its header and its payload. The reader copies small payloads out
// of its buffer (counted in Stats.CopyBytes, as inline data is), and no byte of a larger one.
// The sender mirrors it: a small frame is copied behind its header and leaves in one write
// (counted in Stats.CopyBytes too), a larger one in one writev from registered memory.
//
// Small and medium frames that are ready together (a busy connection's requests, responses
// and ACKs) leave together: a BATCH frame, whose payload is two or more whole frames of at
// most batchFrameMax payload bytes each (at most batchMax bytes in all, never a BATCH),
// without their padding. A medium frame (more than smallMax, at most batchFrameMax) that
// leaves alone is an ordinary padded frame. Its reader takes the
// whole batch in at most two reads, and its frames are then parsed from memory: a write and
// a read per batch rather than per message. A batch is what it carries: it has no PSN and
// is never acknowledged itself.
const (
	headerLen     = 36
	smallMax      = 128
	batchMax      = 64 << 10
	batchFrameMax = 8 << 10
)

// zeroPad is the padding of frames with more than smallMax payload bytes.
var zeroPad [smallMax]byte

// flagAck marks a frame that carries a piggybacked ACK. flagPlaced marks a placed READ
// request or response, or a placed WRITE (placed.go), on a wire whose ends share memory.
// flagAckReq, InfiniBand's AckReq bit, asks the responder to acknowledge at once rather
// than after its coalescing (ackEvery, ackDelay): the requester sets it on a SEND or WRITE
// that leaves half its send queue unacknowledged (ackReqAt), so that a queue shorter than
// ackEvery keeps moving. Only the messages an ACK answers carry it.
const (
	flagAck    = 1
	flagPlaced = 2
	flagAckReq = 4
)

type opcode uint8

const (
	opSend opcode = iota + 1
	opSendImm
	opSendInv
	opWrite
	opWriteImm
	opReadReq
	opReadResp
	opAck
	opNak
	opBatch
	opMax
)

var opNames = [...]string{"", "SEND", "SEND_IMM", "SEND_INV", "WRITE", "WRITE_IMM", "READ_REQ", "READ_RESP", "ACK", "NAK", "BATCH"}

// acked reports whether an ACK answers the message (a READ request is answered by its
// response).
func (o opcode) acked() bool { return o >= opSend && o <= opWriteImm }

func (o opcode) String() string {
	if o > 0 && o < opMax {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// syndrome says why a responder refused a message.
type syndrome uint8

const (
	synNone      syndrome = iota
	synRNR                // no receive posted: retry after the RNR timer
	synInvalid            // invalid request: opcode not allowed, length error, bad invalidation
	synAccess             // remote access error: key, rights or bounds
	synOperation          // remote operational error: the responder failed locally
	synMax
)

type header struct {
	op    opcode
	syn   syndrome
	flags uint16
	psn   uint32
	len   uint32
	imm   uint32
	rkey  uint32
	raddr uint64
	rlen  uint32
	ack   uint32
}

// errFrame is wrapped by every parse failure.
var errFrame = errors.New("soft: malformed frame")

func appendHeader(b []byte, h *header) []byte {
	b = append(b, byte(h.op), byte(h.syn))
	b = binary.LittleEndian.AppendUint16(b, h.flags)
	b = binary.LittleEndian.AppendUint32(b, h.psn)
	b = binary.LittleEndian.AppendUint32(b, h.len)
	b = binary.LittleEndian.AppendUint32(b, h.imm)
	b = binary.LittleEndian.AppendUint32(b, h.rkey)
	b = binary.LittleEndian.AppendUint64(b, h.raddr)
	b = binary.LittleEndian.AppendUint32(b, h.rlen)
	return binary.LittleEndian.AppendUint32(b, h.ack)
}

// parseHeader parses and validates one header from the front of b. It returns the bytes
// after it; the payload (h.len bytes) follows on the stream.
func parseHeader(b []byte, h *header) ([]byte, error) {
	if len(b) < headerLen {
		return b, fmt.Errorf("%w: %d header bytes, need %d", errFrame, len(b), headerLen)
	}
	*h = header{
		op:    opcode(b[0]),
		syn:   syndrome(b[1]),
		flags: binary.LittleEndian.Uint16(b[2:]),
		psn:   binary.LittleEndian.Uint32(b[4:]),
		len:   binary.LittleEndian.Uint32(b[8:]),
		imm:   binary.LittleEndian.Uint32(b[12:]),
		rkey:  binary.LittleEndian.Uint32(b[16:]),
		raddr: binary.LittleEndian.Uint64(b[20:]),
		rlen:  binary.LittleEndian.Uint32(b[28:]),
		ack:   binary.LittleEndian.Uint32(b[32:]),
	}
	switch {
	case h.op == 0 || h.op >= opMax:
		return b, fmt.Errorf("%w: unknown opcode %d", errFrame, b[0])
	case h.flags&^(flagAck|flagPlaced|flagAckReq) != 0:
		return b, fmt.Errorf("%w: %v: reserved flags 0x%04x set", errFrame, h.op, h.flags)
	case h.flags&flagAckReq != 0 && !h.op.acked():
		return b, fmt.Errorf("%w: %v with the ACK request flag, which only a SEND or WRITE carries", errFrame, h.op)
	case h.flags&flagPlaced != 0 && !placedShapeOK(h):
		return b, fmt.Errorf("%w: placed %v with %d payload bytes, raddr 0x%x", errFrame, h.op, h.len, h.raddr)
	case h.flags&flagAck == 0 && h.ack != 0, h.ack > psnMask:
		return b, fmt.Errorf("%w: %v: ack field 0x%x without the ack flag or wider than 24 bits", errFrame, h.op, h.ack)
	case h.op == opAck && h.flags != 0:
		return b, fmt.Errorf("%w: ACK with a piggybacked ack", errFrame)
	case h.psn > psnMask:
		return b, fmt.Errorf("%w: %v: psn 0x%x wider than 24 bits", errFrame, h.op, h.psn)
	case h.len > MaxMessage:
		return b, fmt.Errorf("%w: %v: payload of %d bytes exceeds %d", errFrame, h.op, h.len, MaxMessage)
	case (h.op == opAck || h.op == opNak || h.op == opReadReq) && h.len != 0 && h.flags&flagPlaced == 0:
		return b, fmt.Errorf("%w: %v carries %d payload bytes, want none", errFrame, h.op, h.len)
	case h.op == opNak && (h.syn == synNone || h.syn >= synMax):
		return b, fmt.Errorf("%w: NAK with unknown syndrome %d", errFrame, h.syn)
	case h.op != opNak && h.syn != synNone:
		return b, fmt.Errorf("%w: %v with syndrome %d", errFrame, h.op, h.syn)
	case (h.op == opReadReq || h.op == opReadResp) && h.rlen > MaxMessage:
		return b, fmt.Errorf("%w: READ of %d bytes exceeds %d", errFrame, h.rlen, MaxMessage)
	case h.op == opBatch && (h.len < 2*headerLen || h.len > batchMax):
		return b, fmt.Errorf("%w: BATCH of %d bytes, want %d to %d", errFrame, h.len, 2*headerLen, batchMax)
	case h.op == opBatch && (h.flags != 0 || h.psn|h.imm|h.rkey|h.rlen != 0 || h.raddr != 0):
		return b, fmt.Errorf("%w: BATCH with fields other than its length set", errFrame)
	}
	return b[headerLen:], nil
}

const psnMask = 1<<24 - 1

// placedShapeOK checks a placed frame's shape: a READ request or WRITE with its placement as
// the payload, a READ response without payload or offset, a SEND with one to
// MaxSendPlacements placements.
func placedShapeOK(h *header) bool {
	switch h.op {
	case opReadReq:
		return h.len == placementLen
	case opReadResp:
		return h.len == 0 && h.raddr == 0
	case opWrite:
		return h.len == placementLen && h.rlen <= MaxMessage
	case opSend, opSendImm, opSendInv:
		return h.len > 0 && h.len%placementLen == 0 && h.len <= MaxSendPlacements*placementLen &&
			h.rlen > 0 && h.rlen <= MaxMessage
	}
	return false
}
