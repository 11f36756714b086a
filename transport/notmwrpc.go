package transport

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/mwrpc/mwrpc/transport/credentials"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// ErrNotMwrpcPeer: the peer sent, for its hello, something no mwrpc peer sends (an
// HTTP server, a gRPC server, another protocol): retrying will not help. Dial's error
// wraps it with ErrHandshake, and says what the peer answered.
var ErrNotMwrpcPeer = errors.New("not an mwrpc peer")

// notMwrpc returns an error wrapping ErrNotMwrpcPeer when got, the first bytes a peer
// answered our hello with, cannot begin any answer of an mwrpc peer (a hello, a refusal,
// a TLS server's alert or the plaintext refusal); nil when it might, or got is empty.
func notMwrpc(got []byte) error {
	if len(got) == 0 {
		return nil
	}
	for _, prefix := range [][]byte{wire.HelloPrefix(), wire.RefusalPrefix(), credentials.PlaintextRefusal[:6], {0x15, 0x03}, {0x16, 0x03}} {
		n := min(len(got), len(prefix))
		if bytes.Equal(got[:n], prefix[:n]) {
			return nil
		}
	}
	return fmt.Errorf("%w: it sent %s", ErrNotMwrpcPeer, describeAnswer(got))
}

// describeAnswer names what a peer that is not mwrpc answered, as far as its first bytes
// tell.
func describeAnswer(b []byte) string {
	const show = 16
	shown := fmt.Sprintf("%q", b[:min(len(b), show)])
	switch {
	case bytes.HasPrefix(b, []byte("HTTP/")):
		return shown + " (an HTTP/1 server)"
	case len(b) >= 4 && b[3] == 0x04: // an HTTP/2 frame header of type SETTINGS
		return shown + " (an HTTP/2 server's SETTINGS: gRPC? mwrpc does not speak gRPC's protocol)"
	}
	return shown
}
