package mwnet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/transport/credentials"
)

// certificate signs a certificate for cn with parent (self-signed when parent is nil).
func certificate(t *testing.T, cn string, serial int64, parent *tls.Certificate, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	signer, signerKey := tmpl, any(key)
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	} else {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// TestTLSPeerIdentity: with credentials, each side's Conn names the other's certificate.
func TestTLSPeerIdentity(t *testing.T) {
	leakcheck.Check(t)
	ca := certificate(t, "test CA", 1, nil, x509.ExtKeyUsageAny)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Leaf)
	srvCert := certificate(t, "server", 2, &ca, x509.ExtKeyUsageServerAuth)
	cliCert := certificate(t, "client-7", 3, &ca, x509.ExtKeyUsageClientAuth)
	l, err := Listen("127.0.0.1:0", WithCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{srvCert}, ClientCAs: roots, ClientAuth: tls.RequireAndVerifyClientCert})))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, l.Addr().String(), WithCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cliCert}, RootCAs: roots})))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for side, want := range map[*Conn]string{c: "server", s.(*Conn): "client-7"} {
		info, ok := side.AuthInfo().(credentials.TLSInfo)
		if !ok || len(info.State.PeerCertificates) == 0 || info.State.PeerCertificates[0].Subject.CommonName != want {
			t.Errorf("AuthInfo %#v: want the peer certificate %q", side.AuthInfo(), want)
		}
	}
}
