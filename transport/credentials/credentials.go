// Package credentials secures the TCP connection that sets an mwrpc connection up, in the
// shape of grpc/credentials: a TransportCredentials runs a handshake on the bootstrap
// stream before anything else crosses it, and yields the peer's AuthInfo.
//
// What it protects depends on the fabric (docs/security.md): on the soft TCP fabric the
// bootstrap stream is also the queue pair's wire, so TLS covers every message; on RDMA
// fabrics (ibv: InfiniBand, RoCE, Soft-RoCE) it authenticates the peer and keeps QP numbers,
// GIDs and every exchange of setup private, while the data itself travels on the RDMA
// queue pair, outside TLS.
package credentials

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/mwrpc/mwrpc/transport/internal/wire"
)

// AuthInfo is what a handshake established about the peer.
type AuthInfo interface {
	// AuthType names the mechanism ("tls").
	AuthType() string
}

// TransportCredentials run the client and server sides of a handshake over the bootstrap
// stream. The connection they return replaces conn from then on.
type TransportCredentials interface {
	// ClientHandshake authenticates the server at authority ("host:port", as dialed) over
	// conn, bounded by ctx.
	ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, AuthInfo, error)
	// ServerHandshake authenticates (or just accepts) the client over conn, bounded by ctx.
	ServerHandshake(ctx context.Context, conn net.Conn) (net.Conn, AuthInfo, error)
}

// TLSInfo is the AuthInfo of TLS: the connection state, with the peer's verified
// certificate chain (State.PeerCertificates, State.VerifiedChains).
type TLSInfo struct {
	State tls.ConnectionState
}

// AuthType returns "tls".
func (TLSInfo) AuthType() string { return "tls" }

// ALPN is the application protocol both sides of an mwrpc TLS connection announce: a
// TLS peer of another protocol is refused during the handshake.
const ALPN = "mwrpc"

// ErrPlaintextPeer is matched by handshake errors that come from a peer speaking plain
// mwrpc to a TLS side, or TLS to a plaintext side.
var ErrPlaintextPeer = errors.New("credentials: the peer does not speak TLS")

type tlsCreds struct{ cfg *tls.Config }

// NewTLS returns TLS credentials from cfg (cloned): TLS 1.3 at least, the mwrpc ALPN. A
// server's cfg needs Certificates (or GetCertificate); ClientAuth =
// tls.RequireAndVerifyClientCert with ClientCAs makes it mutual. A client's cfg needs
// RootCAs (nil: the system's) and, for mutual TLS, Certificates; its ServerName defaults
// to the dialed host. VerifyConnection is the hook to check a peer's identity beyond the
// chain (a name, a SPIFFE ID); handlers see the result with rpc.PeerFromContext.
func NewTLS(cfg *tls.Config) TransportCredentials {
	c := cfg.Clone()
	if c.MinVersion < tls.VersionTLS13 {
		c.MinVersion = tls.VersionTLS13
	}
	c.NextProtos = []string{ALPN}
	return &tlsCreds{cfg: c}
}

func (t *tlsCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, AuthInfo, error) {
	cfg := t.cfg
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		host, _, err := net.SplitHostPort(authority)
		if err != nil {
			host = authority
		}
		cfg.ServerName = host
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, nil, fmt.Errorf("credentials: TLS handshake with %s: %w", authority, explain(err))
	}
	return tc, TLSInfo{State: tc.ConnectionState()}, nil
}

func (t *tlsCreds) ServerHandshake(ctx context.Context, conn net.Conn) (net.Conn, AuthInfo, error) {
	tc := tls.Server(conn, t.cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && rh.Conn != nil {
			// A plaintext mwrpc client: tell it, in the place of its hello, so that it can
			// say why rather than "connection reset".
			_, _ = rh.Conn.Write(PlaintextRefusal)
		}
		return nil, nil, fmt.Errorf("credentials: TLS handshake with %s: %w", conn.RemoteAddr(), explain(err))
	}
	return tc, TLSInfo{State: tc.ConnectionState()}, nil
}

// PlaintextRefusal is what a TLS server writes to a client that sent a plaintext hello
// instead of a TLS ClientHello; it is as long as a hello, and starts with a magic of its
// own, so that the client recognizes it where it expects the server's hello.
var PlaintextRefusal = []byte("MWTLS\x00 server requires TLS")

// explain adds what a TLS error most likely means for an mwrpc peer.
func explain(err error) error {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		if refused := wire.RefusalError(rh.RecordHeader[:]); refused != nil {
			return refused // the server turned us away before TLS began (its connection limits)
		}
		return fmt.Errorf("%w (the peer answered in plaintext: it has no TLS credentials configured): %w", ErrPlaintextPeer, err)
	}
	return err
}

// NewServerTLSFromFile returns server credentials from a PEM certificate (chain) and key.
func NewServerTLSFromFile(certFile, keyFile string) (TransportCredentials, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}}), nil
}

// NewClientTLSFromFile returns client credentials that trust the CA certificates in
// caFile (PEM); serverName, if not empty, overrides the name checked in the server's
// certificate.
func NewClientTLSFromFile(caFile, serverName string) (TransportCredentials, error) {
	pool, err := LoadCertPool(caFile)
	if err != nil {
		return nil, err
	}
	return NewTLS(&tls.Config{RootCAs: pool, ServerName: serverName}), nil
}

// LoadCertPool reads the PEM certificates of file into a pool.
func LoadCertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("credentials: no PEM certificate in %s", file)
	}
	return pool, nil
}
