package mwnet

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
)

// TestPeerProcessKilled: a dialing process SIGKILLed while it writes ends the listener
// side's Read and Write with errors (not io.EOF), and the listener serves on.
func TestPeerProcessKilled(t *testing.T) {
	for name, target := range targets(t) {
		t.Run(name, func(t *testing.T) {
			leakcheck.Check(t)
			l := listen(t, target)
			peer := exec.Command(os.Args[0], "-test.run=^$")
			peer.Env = append(os.Environ(), peerEnv+"="+l.Addr().String())
			peer.Stderr = os.Stderr
			if err := peer.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = peer.Process.Kill(); _ = peer.Wait() }()
			s, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := io.ReadFull(s, make([]byte, 1<<20)); err != nil {
				t.Fatalf("reading from the peer before it is killed: %v", err)
			}
			if err := peer.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = s.SetDeadline(time.Now().Add(20 * time.Second))
			_, err = io.Copy(io.Discard, s)
			if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read after the peer was killed: %v; want the connection's failure", err)
			}
			t.Logf("read after the kill: %v", err)
			if _, err := s.Write([]byte("x")); err == nil {
				t.Fatal("write to a killed peer succeeded")
			}
		})
	}
}
