// Package wire is the transport's wire format: the versioned hello exchanged when a
// connection is set up, and the fixed 32-byte header at the front of every SEND.
//
// Parsers take the bytes received and return what they did not consume; they never
// allocate and never trust a length they were given (see FuzzParseHeader).
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed is wrapped by every parse failure.
var ErrMalformed = errors.New("malformed message")

// Version is the transport protocol version this package speaks.
const Version = 6 // 2: control credits in header byte 3; 3: streams; 4: written responses; 5: stream acks ride stream messages; 6: written requests

// HeaderLen is the size of a message header.
const HeaderLen = 32

// Kind is what a message is.
type Kind uint8

// Message kinds.
const (
	KindRequest  Kind = 1 // a call: CallID, payload (eager) or window (large)
	KindResponse Kind = 2 // the answer to CallID; Status is the handler's status
	KindCancel   Kind = 3 // the caller gave up on CallID
	KindRelease  Kind = 4 // carries credits (and, in the SEND_WITH_INV, a revoked window)
	KindPing     Kind = 5 // liveness probe; answered by KindPong with the same CallID
	KindPong     Kind = 6
	KindGoAway   Kind = 7 // the sender takes no new calls; calls already sent complete (CallID 0)
	// KindStreamMsg is one message of the stream CallID (a request with FlagStream opened
	// it): eager or large like a request. FlagEnd marks the sender's last (no payload).
	// An eager one's RKey, when not zero, is a stream ack riding it: the bytes of the
	// other direction the sender has consumed.
	KindStreamMsg Kind = 8
	// KindStreamAck returns flow-control credit for the stream CallID: its StreamAckLen
	// payload says how many bytes the sender has consumed and, when not zero, the window
	// it grants. Status 1 says the sender waits for window.
	KindStreamAck Kind = 9
	// KindGrant gives the caller memory it may write one request into (RDMA WRITE): Len
	// bytes at Addr, in the window whose rkey is RKey. It replaces any grant before it.
	// The caller uses it once, announcing the request with FlagPushed, and only within
	// half the receiver's lease of its arrival; it carries no payload.
	KindGrant Kind = 10
	kindMax   Kind = 11
)

var kindNames = [...]string{"", "request", "response", "cancel", "release", "ping", "pong", "goaway", "stream message", "stream ack", "grant"}

// String returns the kind's name.
func (k Kind) String() string {
	if k > 0 && k < kindMax {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Flags qualify a message.
type Flags uint8

// FlagLarge says the payload was not sent eagerly: Len bytes at Addr are exposed through a
// memory window whose rkey is RKey, for the receiver to RDMA READ.
const FlagLarge Flags = 1 << 0

// Stream flags.
const (
	// FlagStream, on a request, opens a stream: the request is its first message, and
	// Status carries the opener's receive window in KiB.
	FlagStream Flags = 1 << 1
	// FlagEnd, on a stream message, is the sender's last: it sends no more (half-close).
	FlagEnd Flags = 1 << 2
	// FlagCaller, on a stream message or ack, says the sender opened the stream: CallID is
	// in its own id space (the receiver serves the stream) rather than the receiver's.
	FlagCaller Flags = 1 << 3
	// FlagWritable, on a large request (not a stream's), says its window also grants
	// REMOTE_WRITE: the response, if it is no longer than Len, may be written into the
	// window with an RDMA WRITE once the request is read, and announced with FlagWritten.
	FlagWritable Flags = 1 << 4
	// FlagWritten, on a response, says its Len payload bytes were written (RDMA WRITE, just
	// before this SEND) at the start of the caller's request window, which this message
	// revokes (SEND_WITH_INV): the caller finds the response there. It carries no payload
	// and no window of its own.
	FlagWritten Flags = 1 << 5
	// FlagPushed, on a request (with FlagWritable, and neither FlagLarge nor FlagStream),
	// says its Len payload bytes were written (RDMA WRITE, just before this SEND) at the
	// start of the receiver's grant (KindGrant), which this message revokes
	// (SEND_WITH_INV). RKey and Addr are the caller's window of Len bytes that the response
	// may be written into, as with FlagWritable; it carries no payload.
	FlagPushed Flags = 1 << 6
	flagsAll         = FlagLarge | FlagStream | FlagEnd | FlagCaller | FlagWritable | FlagWritten | FlagPushed
)

// StreamAckLen is the payload of a KindStreamAck: consumed u32 | window u32.
const StreamAckLen = 8

const magic = 0xA7

// Header is the front of every message:
//
//	0  magic u8 (0xA7)  1 kind u8  2 flags u8
//	3  ctrl credits u8  control slots (those releases use) the sender reposted since its last message
//	4  credits u16      receive slots the sender reposted since its last message
//	6  status u16       the handler's status (responses)
//	8  call id u64
//	16 len u32          payload bytes: after the header (eager) or in the window (large)
//	20 rkey u32         the window's rkey (large); bytes consumed (an eager stream message)
//	24 addr u64         the window's first byte (large)
type Header struct {
	Kind        Kind
	Flags       Flags
	CtrlCredits uint8
	Credits     uint16
	Status      uint16
	CallID      uint64
	Len         uint32
	RKey        uint32
	Addr        uint64
}

// PutHeader writes h into the first HeaderLen bytes of b.
func PutHeader(b []byte, h *Header) {
	_ = b[HeaderLen-1]
	b[0], b[1], b[2], b[3] = magic, byte(h.Kind), byte(h.Flags), h.CtrlCredits
	binary.LittleEndian.PutUint16(b[4:], h.Credits)
	binary.LittleEndian.PutUint16(b[6:], h.Status)
	binary.LittleEndian.PutUint64(b[8:], h.CallID)
	binary.LittleEndian.PutUint32(b[16:], h.Len)
	binary.LittleEndian.PutUint32(b[20:], h.RKey)
	binary.LittleEndian.PutUint64(b[24:], h.Addr)
}

// AppendHeader appends h to b.
func AppendHeader(b []byte, h *Header) []byte {
	var buf [HeaderLen]byte
	PutHeader(buf[:], h)
	return append(b, buf[:]...)
}

// ParseHeader parses the message in b (one whole SEND): the header, and for an eager
// message its payload, which it returns (aliasing b). maxLen bounds the length a large
// message may announce.
func ParseHeader(b []byte, h *Header, maxLen uint32) (payload []byte, err error) {
	if len(b) < HeaderLen {
		return nil, fmt.Errorf("%w: %d bytes, a header needs %d", ErrMalformed, len(b), HeaderLen)
	}
	*h = Header{
		Kind:        Kind(b[1]),
		Flags:       Flags(b[2]),
		CtrlCredits: b[3],
		Credits:     binary.LittleEndian.Uint16(b[4:]),
		Status:      binary.LittleEndian.Uint16(b[6:]),
		CallID:      binary.LittleEndian.Uint64(b[8:]),
		Len:         binary.LittleEndian.Uint32(b[16:]),
		RKey:        binary.LittleEndian.Uint32(b[20:]),
		Addr:        binary.LittleEndian.Uint64(b[24:]),
	}
	rest := b[HeaderLen:]
	switch {
	case b[0] != magic:
		return nil, fmt.Errorf("%w: magic 0x%02x, want 0x%02x", ErrMalformed, b[0], magic)
	case h.Kind == 0 || h.Kind >= kindMax:
		return nil, fmt.Errorf("%w: unknown kind %d", ErrMalformed, b[1])
	case h.Flags&^flagsAll != 0:
		return nil, fmt.Errorf("%w: %v: unknown flags 0x%02x", ErrMalformed, h.Kind, b[2])
	case h.Flags&FlagStream != 0 && h.Kind != KindRequest,
		h.Flags&FlagEnd != 0 && (h.Kind != KindStreamMsg || h.Flags&FlagLarge != 0 || h.Len != 0),
		h.Flags&FlagCaller != 0 && h.Kind != KindStreamMsg && h.Kind != KindStreamAck,
		h.Flags&FlagWritable != 0 && (h.Kind != KindRequest || h.Flags&(FlagLarge|FlagStream|FlagPushed) != FlagLarge && h.Flags != FlagPushed|FlagWritable),
		h.Flags&FlagWritten != 0 && (h.Kind != KindResponse || h.Flags != FlagWritten),
		h.Flags&FlagPushed != 0 && (h.Kind != KindRequest || h.Flags != FlagPushed|FlagWritable),
		h.Kind == KindGrant && h.Flags != 0:
		return nil, fmt.Errorf("%w: %v with flags 0x%02x", ErrMalformed, h.Kind, b[2])
	case h.Flags&FlagPushed != 0, h.Kind == KindGrant:
		switch {
		case len(rest) != 0 || h.RKey == 0 || h.Addr == 0:
			return nil, fmt.Errorf("%w: %v with %d eager bytes or no window", ErrMalformed, h.Kind, len(rest))
		case h.Len == 0 || h.Len > maxLen:
			return nil, fmt.Errorf("%w: %v of %d bytes (limit %d): %w", ErrMalformed, h.Kind, h.Len, maxLen, ErrTooLarge)
		}
		return nil, nil
	case h.Flags&FlagWritten != 0:
		switch {
		case len(rest) != 0 || h.RKey != 0 || h.Addr != 0:
			return nil, fmt.Errorf("%w: written response with %d eager bytes or a window", ErrMalformed, len(rest))
		case h.Len == 0 || h.Len > maxLen:
			return nil, fmt.Errorf("%w: written response of %d bytes (limit %d): %w", ErrMalformed, h.Len, maxLen, ErrTooLarge)
		}
		return nil, nil
	case h.Flags&FlagLarge == 0:
		if uint64(h.Len) != uint64(len(rest)) {
			return nil, fmt.Errorf("%w: %v announces %d payload bytes, carries %d", ErrMalformed, h.Kind, h.Len, len(rest))
		}
		if h.Addr != 0 || h.RKey != 0 && h.Kind != KindStreamMsg {
			return nil, fmt.Errorf("%w: eager %v with a window address", ErrMalformed, h.Kind)
		}
		if h.Kind == KindStreamAck && len(rest) != StreamAckLen {
			return nil, fmt.Errorf("%w: stream ack of %d bytes, want %d", ErrMalformed, len(rest), StreamAckLen)
		}
		return rest, nil
	case h.Kind != KindRequest && h.Kind != KindResponse && h.Kind != KindStreamMsg:
		return nil, fmt.Errorf("%w: %v cannot be large", ErrMalformed, h.Kind)
	case len(rest) != 0:
		return nil, fmt.Errorf("%w: large %v carries %d eager bytes", ErrMalformed, h.Kind, len(rest))
	case h.Len == 0 || h.Len > maxLen:
		return nil, fmt.Errorf("%w: large %v of %d bytes (limit %d): %w", ErrMalformed, h.Kind, h.Len, maxLen, ErrTooLarge)
	}
	return nil, nil
}

// ErrTooLarge is wrapped when a message exceeds the maximum message size.
var ErrTooLarge = errors.New("message exceeds the maximum message size")

// HelloLen is the size of the hello message.
const HelloLen = 24

var helloMagic = [4]byte{'M', 'W', 'R', 'T'}

// Hello is what each side announces when a connection is set up.
//
//	0 "MWRT"  4 version u16  6 reserved u16  8 slot size u32  12 credits u32
//	16 inline threshold u32  20 max message u32
type Hello struct {
	Version    uint16
	SlotSize   uint32 // bytes in each receive slot the sender posts: the largest SEND it takes
	Credits    uint32 // receive slots the sender posts: SENDs the peer may have outstanding
	Inline     uint32 // the sender's eager threshold: larger payloads go through a window
	MaxMessage uint32 // the largest payload the sender accepts
}

// HelloPrefix returns the bytes every hello begins with.
func HelloPrefix() []byte { return helloMagic[:] }

// AppendHello appends h to b.
func AppendHello(b []byte, h *Hello) []byte {
	b = append(b, helloMagic[:]...)
	b = binary.LittleEndian.AppendUint16(b, h.Version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, h.SlotSize)
	b = binary.LittleEndian.AppendUint32(b, h.Credits)
	b = binary.LittleEndian.AppendUint32(b, h.Inline)
	return binary.LittleEndian.AppendUint32(b, h.MaxMessage)
}

// ParseHello parses a hello from the front of b and returns the rest.
func ParseHello(b []byte, h *Hello) ([]byte, error) {
	if len(b) < HelloLen {
		return b, fmt.Errorf("%w: hello of %d bytes, need %d", ErrMalformed, len(b), HelloLen)
	}
	if [4]byte(b[:4]) != helloMagic {
		return b, fmt.Errorf("%w: not an mwrpc peer (hello magic %q)", ErrMalformed, b[:4])
	}
	*h = Hello{
		Version:    binary.LittleEndian.Uint16(b[4:]),
		SlotSize:   binary.LittleEndian.Uint32(b[8:]),
		Credits:    binary.LittleEndian.Uint32(b[12:]),
		Inline:     binary.LittleEndian.Uint32(b[16:]),
		MaxMessage: binary.LittleEndian.Uint32(b[20:]),
	}
	switch {
	case h.Version != Version:
		return b, fmt.Errorf("%w: peer speaks protocol version %d, this side %d", ErrMalformed, h.Version, Version)
	case b[6] != 0 || b[7] != 0:
		return b, fmt.Errorf("%w: hello reserved bytes set", ErrMalformed)
	case h.SlotSize < HeaderLen || h.Credits < 2 || h.Credits > 1<<16 || h.MaxMessage == 0:
		return b, fmt.Errorf("%w: hello slot size %d (min %d), credits %d (2..65536), max message %d", ErrMalformed, h.SlotSize, HeaderLen, h.Credits, h.MaxMessage)
	case uint64(h.Inline)+HeaderLen > uint64(h.SlotSize):
		return b, fmt.Errorf("%w: hello inline threshold %d does not fit slot size %d", ErrMalformed, h.Inline, h.SlotSize)
	}
	return b[HelloLen:], nil
}

// Refusal is what a server sends in place of its hello when it will not take a
// connection, so that the client can say why instead of "connection reset":
//
//	0 "MWNO"  4 reason u8  5 reserved (zero) up to HelloLen
//
// It is as long as a hello, and it is sent before any credentials' handshake (turning a
// connection away must cost the server less than taking it), so a TLS client finds its
// first five bytes where it expects a TLS record header.
type Refusal uint8

// Refusal reasons.
const (
	RefusedConns   Refusal = 1 // the server holds its maximum of connections
	RefusedHost    Refusal = 2 // the server holds its maximum of connections from this host
	RefusedClosing Refusal = 3 // the server is shutting down
	RefusedRate    Refusal = 4 // this host opens connections faster than the server takes them
)

var refusalMagic = [4]byte{'M', 'W', 'N', 'O'}

// ErrRefused is wrapped by the error ParseRefusal returns.
var ErrRefused = errors.New("the server refused the connection")

func (r Refusal) String() string {
	switch r {
	case RefusedConns:
		return "it holds its maximum of connections"
	case RefusedHost:
		return "it holds its maximum of connections from this host"
	case RefusedClosing:
		return "it is shutting down"
	case RefusedRate:
		return "this host opens connections faster than it takes them"
	}
	return fmt.Sprintf("reason %d", uint8(r))
}

// RefusalPrefix returns the bytes every refusal record begins with.
func RefusalPrefix() []byte { return refusalMagic[:] }

// AppendRefusal appends a refusal record of HelloLen bytes to b.
func AppendRefusal(b []byte, r Refusal) []byte {
	b = append(b, refusalMagic[:]...)
	b = append(b, byte(r))
	return append(b, make([]byte, HelloLen-5)...)
}

// RefusalError returns, when b (its first five bytes at least: a TLS client has no more)
// starts a refusal record, an error wrapping ErrRefused that says why; otherwise nil.
func RefusalError(b []byte) error {
	if len(b) < 5 || [4]byte(b[:4]) != refusalMagic {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrRefused, Refusal(b[4]))
}
