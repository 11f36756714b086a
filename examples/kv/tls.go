package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport/credentials"
)

// TLS for -serve and -connect (README: "TLS and mutual TLS" makes a test CA and
// certificates with openssl).
var (
	tlsCert = flag.String("tls-cert", "", "PEM certificate: the server's (-serve), or the client's for mutual TLS (-connect)")
	tlsKey  = flag.String("tls-key", "", "PEM private key of -tls-cert")
	tlsCA   = flag.String("tls-ca", "", "PEM CA certificate: -serve requires client certificates signed by it; -connect trusts servers signed by it")
)

func tlsRequested() bool { return *tlsCert != "" || *tlsKey != "" || *tlsCA != "" }

// keyPair loads -tls-cert and -tls-key, which go together.
func keyPair() ([]tls.Certificate, error) {
	if (*tlsCert == "") != (*tlsKey == "") {
		return nil, errors.New("-tls-cert and -tls-key go together")
	}
	if *tlsCert == "" {
		return nil, nil
	}
	c, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
	if err != nil {
		return nil, fmt.Errorf("-tls-cert/-tls-key: %w", err)
	}
	return []tls.Certificate{c}, nil
}

// serverTLS returns the server's credentials option, or nil without TLS flags.
func serverTLS() (rpc.ServerOption, error) {
	if !tlsRequested() {
		return nil, nil
	}
	certs, err := keyPair()
	if err != nil {
		return nil, err
	}
	if certs == nil {
		return nil, errors.New("-serve with TLS needs -tls-cert and -tls-key")
	}
	cfg := &tls.Config{Certificates: certs}
	if *tlsCA != "" {
		if cfg.ClientCAs, err = credentials.LoadCertPool(*tlsCA); err != nil {
			return nil, err
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return rpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// clientTLS returns the client's credentials option, or nil without TLS flags.
func clientTLS() (rpc.DialOption, error) {
	if !tlsRequested() {
		return nil, nil
	}
	certs, err := keyPair()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: certs}
	if *tlsCA != "" {
		if cfg.RootCAs, err = credentials.LoadCertPool(*tlsCA); err != nil {
			return nil, err
		}
	}
	return rpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}
