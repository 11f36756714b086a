package rpc

import (
	"context"
	"slices"
	"strings"

	"github.com/mwrpc/mwrpc/transport"
)

// MD is call metadata: lowercase keys, each with one or more values, as in gRPC. A client's
// outgoing metadata travels with the request; a handler's trailer travels with the response.
type MD map[string][]string

// Pairs returns metadata from key, value pairs (keys are lowercased).
func Pairs(kv ...string) MD {
	if len(kv)%2 == 1 {
		panic("mwrpc: Pairs got an odd number of arguments")
	}
	md := make(MD, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		k := strings.ToLower(kv[i])
		md[k] = append(md[k], kv[i+1])
	}
	return md
}

type outgoingKey struct{}

// NewOutgoingContext returns a context whose calls carry md.
func NewOutgoingContext(ctx context.Context, md MD) context.Context {
	return context.WithValue(ctx, outgoingKey{}, md)
}

func outgoing(ctx context.Context) MD {
	md, _ := ctx.Value(outgoingKey{}).(MD)
	return md
}

// FromIncomingContext returns the metadata the caller sent, in a handler's context.
func FromIncomingContext(ctx context.Context) (MD, bool) {
	st, ok := ctx.Value(streamKey{}).(*serverStream)
	if !ok || st.nmd == 0 {
		return nil, ok
	}
	if st.inMD == nil {
		st.inMD = decodeMD(st.md, st.nmd)
	}
	return st.inMD, true
}

// SetTrailer adds md to the metadata the response carries back to the caller. It fails
// outside a handler.
func SetTrailer(ctx context.Context, md MD) error {
	st, ok := ctx.Value(streamKey{}).(*serverStream)
	if !ok {
		return Errorf(Internal, "mwrpc: SetTrailer outside a handler")
	}
	merged := make(MD, len(st.trailer)+len(md))
	for k, v := range st.trailer {
		merged[k] = v
	}
	for k, v := range md {
		k = strings.ToLower(k)
		merged[k] = append(slices.Clip(merged[k]), v...)
	}
	if err := checkMD(merged); err != nil { // the whole trailer must fit the envelope
		return &Status{Code: InvalidArgument, Message: err.Error(), cause: err}
	}
	st.trailer = merged
	return nil
}

// Method returns the full method name ("/kv.KV/Get") of the call a handler serves.
func Method(ctx context.Context) (string, bool) {
	st, ok := ctx.Value(streamKey{}).(*serverStream)
	if !ok {
		return "", false
	}
	return st.method.full, true
}

// Peer is the caller of a call a handler serves: its address and, with transport
// credentials, what the handshake established (credentials.TLSInfo: the verified client
// certificate chain under mutual TLS).
type Peer = transport.Peer

// PeerFromContext returns the caller, in a handler's (or server interceptor's) context.
func PeerFromContext(ctx context.Context) (Peer, bool) {
	st, ok := ctx.Value(streamKey{}).(*serverStream)
	if !ok || st.w == nil {
		return Peer{}, false
	}
	return st.w.Peer(), true
}

// SetHeader adds md to the response headers of the call a handler serves: what the
// caller's Header call option (or ClientStream.Header) returns. A unary call's headers
// travel with its response; a stream's go ahead of its first message, or with its end if
// it sends none. It fails outside a handler and once the headers were sent (SendHeader,
// or a stream's first message).
func SetHeader(ctx context.Context, md MD) error {
	st, ok := ctx.Value(streamKey{}).(*serverStream)
	if !ok {
		return Errorf(Internal, "mwrpc: SetHeader outside a handler")
	}
	if st.hdrSent {
		return Errorf(Internal, "mwrpc: SetHeader after the headers were sent (SendHeader, or a stream's first message)")
	}
	merged, err := mergeMD(st.header, md)
	if err != nil {
		return err
	}
	st.header = merged
	return nil
}

// SendHeader adds md to the response headers and sends them: a stream's at once, ahead of
// its messages; a unary call's are fixed now and travel with its response. Headers can
// be sent once: SetHeader and SendHeader fail afterwards.
func SendHeader(ctx context.Context, md MD) error {
	if err := SetHeader(ctx, md); err != nil {
		return err
	}
	st := ctx.Value(streamKey{}).(*serverStream)
	if st.ss != nil {
		return st.ss.sendHeader()
	}
	st.hdrSent = true
	return nil
}

// mergeMD returns a merged with md (keys lower-cased), checked to fit an envelope.
func mergeMD(a, md MD) (MD, error) {
	merged := make(MD, len(a)+len(md))
	for k, v := range a {
		merged[k] = v
	}
	for k, v := range md {
		k = strings.ToLower(k)
		merged[k] = append(slices.Clip(merged[k]), v...)
	}
	if err := checkMD(merged); err != nil {
		return nil, &Status{Code: InvalidArgument, Message: err.Error(), cause: err}
	}
	return merged, nil
}

// unsentHeader returns the headers a response must carry: SetHeader's, unless a stream's
// header message already took them.
func (st *serverStream) unsentHeader() MD {
	if st.ss != nil && st.hdrSent {
		return nil
	}
	return st.header
}
