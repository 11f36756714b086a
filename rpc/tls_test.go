package rpc_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/credentials"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

var serial atomicSerial

type atomicSerial struct {
	mu sync.Mutex
	n  int64
}

func (s *atomicSerial) next() *big.Int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return big.NewInt(s.n)
}

func newCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial.next(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns a certificate for cn: a server's for 127.0.0.1, or a client's.
func (ca *testCA) issue(t testing.TB, cn string, server bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial.next(), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// syncBuffer is a log destination shared by the server's goroutines and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTLS: a server with TLS and a client CA serves a client with a good certificate, and
// refuses a client without one, one with a certificate from another CA, a plaintext client
// and a client that does not trust it, each with a clear error on both sides; a TLS client
// gets a clear error from a plaintext server.
func TestTLS(t *testing.T) {
	ca, other := newCA(t, "mwrpc test CA"), newCA(t, "another CA")
	serverCreds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.issue(t, "server", true)},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: ca.pool})
	client := func(roots *x509.CertPool, certs ...tls.Certificate) rpc.DialOption {
		return rpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs}))
	}
	cases := []struct {
		name       string
		server     []rpc.ServerOption
		client     []rpc.DialOption
		clientErr  string // "" for a working call
		serverLogs string
	}{
		{"mutual TLS", []rpc.ServerOption{rpc.WithTransportCredentials(serverCreds)},
			[]rpc.DialOption{client(ca.pool, ca.issue(t, "client-1", false))}, "", ""},
		{"no client certificate", []rpc.ServerOption{rpc.WithTransportCredentials(serverCreds)},
			[]rpc.DialOption{client(ca.pool)}, "certificate required", "client didn't provide a certificate"},
		{"client certificate of another CA", []rpc.ServerOption{rpc.WithTransportCredentials(serverCreds)},
			// Go's client offers no certificate the server's CA list does not name: force it,
			// as an intruder would.
			[]rpc.DialOption{rpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool,
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					c := other.issue(t, "intruder", false)
					return &c, nil
				}}))}, "unknown certificate authority", "certificate signed by unknown authority"},
		{"plaintext client", []rpc.ServerOption{rpc.WithTransportCredentials(serverCreds)},
			nil, "the server requires TLS", "the peer answered in plaintext"},
		{"client does not trust the server", []rpc.ServerOption{rpc.WithTransportCredentials(serverCreds)},
			[]rpc.DialOption{client(other.pool, ca.issue(t, "client-1", false))}, "certificate signed by unknown authority", "bad certificate"},
		{"TLS client, plaintext server", nil,
			[]rpc.DialOption{client(ca.pool, ca.issue(t, "client-1", false))}, "the peer answered in plaintext", "the peer speaks TLS and this side has no transport credentials"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logs := new(syncBuffer)
			var seen rpc.Peer
			var seenMu sync.Mutex
			record := func(ctx context.Context, req any, info *rpc.UnaryServerInfo, h rpc.UnaryHandler) (any, error) {
				p, ok := rpc.PeerFromContext(ctx)
				if !ok {
					return nil, rpc.Errorf(rpc.Internal, "no peer in the handler's context")
				}
				seenMu.Lock()
				seen = p
				seenMu.Unlock()
				return h(ctx, req)
			}
			sopts := append(deviceServerOpts(t, tc.server...), rpc.WithUnaryInterceptor(record),
				rpc.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			srv := rpc.NewServer(sopts...)
			srv.RegisterService(&svcDesc, &impl{slept: make(chan error, 1)})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(ln)
			defer srv.Stop()
			copts := tc.client
			if withDevices != nil {
				_, c := withDevices(t)
				copts = append(c, copts...)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl, err := rpc.Dial(ctx, ln.Addr().String(), copts...)
			if err == nil {
				defer cl.Close()
				_, err = svcClient{cl}.Echo(ctx, &Msg{Text: "over TLS"})
			}
			if tc.clientErr == "" {
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				seenMu.Lock()
				info, ok := seen.AuthInfo.(credentials.TLSInfo)
				seenMu.Unlock()
				if !ok || len(info.State.PeerCertificates) == 0 || info.State.PeerCertificates[0].Subject.CommonName != "client-1" ||
					info.State.NegotiatedProtocol != credentials.ALPN || info.State.Version != tls.VersionTLS13 {
					t.Fatalf("the handler's peer: %+v", seen)
				}
				return
			}
			if err == nil || !errors.Is(err, rpc.ErrUnavailable) || !strings.Contains(err.Error(), tc.clientErr) {
				t.Fatalf("client: %v, want Unavailable saying %q", err, tc.clientErr)
			}
			if strings.Contains(err.Error(), "deadline exceeded") { // no retry helps: Dial says so at once
				t.Fatalf("Dial waited for its deadline on a refusal no retry changes: %v", err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for !strings.Contains(logs.String(), tc.serverLogs) {
				if time.Now().After(deadline) {
					t.Fatalf("server logs lack %q:\n%s", tc.serverLogs, logs)
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
