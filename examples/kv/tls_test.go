package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTLSFlags runs the README's recipe: mkcerts.sh, a server with -tls-cert, -tls-key and
// -tls-ca (mutual TLS), and clients with the flags, without a certificate, with one from
// another CA, and without TLS: only the first is served, the others fail saying why, and
// the server logs each refusal.
func TestTLSFlags(t *testing.T) {
	requireInterrupt(t) // and mkcerts.sh is a shell script
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is missing: apt-get install -y openssl (mkcerts.sh uses it)")
	}
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if out, err := exec.Command("./mkcerts.sh", d).CombinedOutput(); err != nil {
			t.Fatalf("mkcerts.sh: %v\n%s", err, out)
		}
	}
	f := func(d, name string) string { return filepath.Join(d, name) }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, addr, logs := serveExample(t, ctx, "-tls-cert "+f(dir, "server.pem")+" -tls-key "+f(dir, "server.key")+" -tls-ca "+f(dir, "ca.pem"), nil)
	cases := []struct {
		name, flags, clientSays, serverSays string
	}{
		{"good certificate", "-tls-cert " + f(dir, "client.pem") + " -tls-key " + f(dir, "client.key") + " -tls-ca " + f(dir, "ca.pem"), "put and got back a 1048576-byte value", ""},
		{"no certificate", "-tls-ca " + f(dir, "ca.pem"), "certificate required", "client didn't provide a certificate"},
		{"certificate of another CA", "-tls-cert " + f(other, "client.pem") + " -tls-key " + f(other, "client.key") + " -tls-ca " + f(dir, "ca.pem"), "unknown certificate authority", "certificate signed by unknown authority"},
		{"server of another CA", "-tls-cert " + f(dir, "client.pem") + " -tls-key " + f(dir, "client.key") + " -tls-ca " + f(other, "ca.pem"), "certificate signed by unknown authority", "bad certificate"},
		{"plaintext", "", "the server requires TLS", "the peer answered in plaintext"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
			defer ccancel()
			out, err := example(t, cctx, "-connect "+addr+" -calls 10 "+tc.flags).CombinedOutput()
			if (err == nil) != (tc.serverSays == "") || !strings.Contains(string(out), tc.clientSays) {
				t.Fatalf("client: %v, want its output to say %q:\n%s", err, tc.clientSays, out)
			}
			if tc.serverSays == "" {
				return
			}
			for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), tc.serverSays); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the server's log lacks %q:\n%s", tc.serverSays, logs.String())
				}
			}
		})
	}
	if err := srv.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v\n%s", err, logs.String())
	}
}
