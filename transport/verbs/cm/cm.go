// Package cm is a small connection manager for reliable-connected queue pairs: over an
// already-connected byte stream (TCP, as in brpc's bootstrap) the two sides exchange their
// endpoints (QP number, first PSN, LID, GID), then each moves its QP through INIT and RTR,
// tells the other it is ready to receive, and moves to RTS once the peer is too (the
// part of the InfiniBand CM's REQ/REP/RTU exchange that matters: nothing is sent to a QP
// that would drop it). For providers whose wire is a byte stream (the soft TCP fabric), the
// same connection then carries the QP's traffic, and nothing can be dropped.
package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Wire format of the endpoint message, little-endian, 32 bytes:
//
//	magic "MWCM" | version u16 | lid u16 | qpn u32 | psn u32 | gid [16]byte
//
// Version 2 follows it with one byte, readyMarker, once the sender's QP is in RTR (not
// on a stream QP, whose wire the connection becomes).
const (
	msgLen  = 32
	version = 2

	readyMarker = 'R'
)

var magic = [4]byte{'M', 'W', 'C', 'M'}

// ErrHandshake is returned when the peer's endpoint message is malformed or of another
// version; the connection should be closed.
var ErrHandshake = errors.New("cm: bad handshake")

// AppendEndpoint appends the wire form of e to b.
func AppendEndpoint(b []byte, e verbs.Endpoint) []byte {
	b = append(b, magic[:]...)
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, e.LID)
	b = binary.LittleEndian.AppendUint32(b, e.QPN)
	b = binary.LittleEndian.AppendUint32(b, e.PSN)
	return append(b, e.GID[:]...)
}

// ParseEndpoint parses one endpoint message from the front of b and returns the rest.
func ParseEndpoint(b []byte) (verbs.Endpoint, []byte, error) {
	var e verbs.Endpoint
	if len(b) < msgLen {
		return e, b, fmt.Errorf("%w: %d bytes, need %d", ErrHandshake, len(b), msgLen)
	}
	if [4]byte(b[:4]) != magic {
		return e, b, fmt.Errorf("%w: magic %q, want %q", ErrHandshake, b[:4], magic[:])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != version {
		return e, b, fmt.Errorf("%w: version %d, this side speaks %d", ErrHandshake, v, version)
	}
	e.LID = binary.LittleEndian.Uint16(b[6:])
	e.QPN = binary.LittleEndian.Uint32(b[8:])
	e.PSN = binary.LittleEndian.Uint32(b[12:])
	copy(e.GID[:], b[16:32])
	return e, b[msgLen:], nil
}

// Params are the queue-pair attributes both sides apply while connecting.
type Params struct {
	Access          verbs.Access  // remote rights granted to the peer (INIT)
	PathMTU         int           // RTR
	MaxDestRdAtomic int           // RTR: READs served at once
	MinRNRTimer     time.Duration // RTR
	MaxRdAtomic     int           // RTS: READs outstanding at once
	Timeout         time.Duration // RTS
	RetryCnt        int           // RTS
	RNRRetry        int           // RTS; 7 is infinite
}

// DefaultParams grants REMOTE_READ and REMOTE_WRITE, 16 READs each way, and infinite RNR
// retries with a 1 ms RNR timer.
func DefaultParams() Params {
	return Params{
		Access:          verbs.AccessRemoteRead | verbs.AccessRemoteWrite,
		MaxDestRdAtomic: 16,
		MaxRdAtomic:     16,
		MinRNRTimer:     time.Millisecond,
		RNRRetry:        7,
		RetryCnt:        7,
	}
}

// Connect exchanges endpoints with the peer over conn and moves qp (in RESET or INIT) to
// RTS. The context bounds the exchange. It returns the peer's endpoint. If the QP's
// provider carries traffic over a stream, conn becomes the QP's wire and belongs to it;
// otherwise conn stays the caller's.
//
// A QP without a stream reaches RTS only after the peer's has reached RTR, so the first
// SENDs are not dropped and retransmitted. That matters beyond the delay: Linux's rxe (6.1) runs a
// retransmission from the oldest unacknowledged request again, and re-executes the
// BIND_MW and LOCAL_INV requests queued behind it, which fail (MW_BIND_ERR) or act twice
// (docs/verbs.md, "What rxe ... does differently").
func Connect(ctx context.Context, conn net.Conn, qp verbs.QP, p Params) (verbs.Endpoint, error) {
	var remote verbs.Endpoint
	if qp.State() == verbs.QPStateReset {
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPStateInit, Access: p.Access}); err != nil {
			return remote, fmt.Errorf("cm: qp %d to INIT: %w", qp.Num(), err)
		}
	}
	in := make([]byte, msgLen)
	if err := Exchange(ctx, conn, "endpoint", AppendEndpoint(make([]byte, 0, msgLen), qp.Endpoint()), in); err != nil {
		return remote, fmt.Errorf("cm: %w", err)
	}
	remote, _, err := ParseEndpoint(in)
	if err != nil {
		return remote, err
	}
	sq, ok := qp.(verbs.StreamQP)
	stream := ok && sq.NeedsStream()
	if stream {
		if err := sq.AttachStream(conn); err != nil {
			return remote, fmt.Errorf("cm: attach stream to qp %d: %w", qp.Num(), err)
		}
	}
	rtr := verbs.QPAttr{State: verbs.QPStateRTR, Remote: remote, PathMTU: p.PathMTU,
		MaxDestRdAtomic: p.MaxDestRdAtomic, MinRNRTimer: p.MinRNRTimer}
	if err := qp.Modify(rtr); err != nil {
		return remote, fmt.Errorf("cm: qp %d to RTR: %w", qp.Num(), err)
	}
	if !stream {
		ready := []byte{0}
		if err := Exchange(ctx, conn, "ready marker", []byte{readyMarker}, ready); err != nil {
			return remote, fmt.Errorf("cm: %w", err)
		}
		if ready[0] != readyMarker {
			return remote, fmt.Errorf("%w: peer's ready marker is 0x%02x, want 0x%02x", ErrHandshake, ready[0], readyMarker)
		}
	}
	rts := verbs.QPAttr{State: verbs.QPStateRTS, MaxRdAtomic: p.MaxRdAtomic, Timeout: p.Timeout,
		RetryCnt: p.RetryCnt, RNRRetry: p.RNRRetry}
	if err := qp.Modify(rts); err != nil {
		return remote, fmt.Errorf("cm: qp %d to RTS: %w", qp.Num(), err)
	}
	return remote, nil
}

// Exchange writes out to conn and reads len(in) bytes from it at once, both bounded by
// ctx alone: when it is done, a past deadline unblocks both directions, and the error is
// the context's. what names the message in errors. Connect exchanges its messages so, and
// so does a protocol that speaks on the same stream before it (the transport's hello).
func Exchange(ctx context.Context, conn net.Conn, what string, out, in []byte) error {
	_, err := ExchangeN(ctx, conn, what, out, in)
	return err
}

// ExchangeN is Exchange that also returns how many bytes of in it read: what a peer
// that answered with less than a whole message did say.
func ExchangeN(ctx context.Context, conn net.Conn, what string, out, in []byte) (int, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	errc := make(chan error, 1)
	go func() { _, err := conn.Write(out); errc <- err }()
	n, rerr := io.ReadFull(conn, in)
	werr := <-errc
	stopped := stop()
	_ = conn.SetDeadline(time.Time{})
	switch {
	case !stopped || ctx.Err() != nil:
		return n, fmt.Errorf("%s exchange: %w", what, ctx.Err())
	case werr != nil:
		return n, fmt.Errorf("send %s: %w", what, werr)
	case rerr != nil:
		return n, fmt.Errorf("read peer %s: %w", what, rerr)
	}
	return n, nil
}
