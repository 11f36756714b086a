package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs/shm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// injector is an shm connection through which a test writes bytes of its own between the
// frames of the QP that owns it: an attacker in the peer's process.
type injector struct {
	*shm.Conn
}

func (i injector) inject(b []byte) error { _, err := i.Conn.Write(b); return err }

// TestHostileSHM: the shm fabric's row of the hostile-peer suite. A peer that sends garbage
// instead of a hello fails its own setup (counted, logged); a peer that writes garbage
// frames into its ring after setup fails its own connection as a protocol break (counted,
// logged with the parser's reason); a good client's calls over shm go on throughout, and
// the server returns to one connection, no window exposed, no handler running.
func TestHostileSHM(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	e := newEnv(t, fabricNamed(t, "shm"), echo, hostileConfig(lockedWriter{&mu, &logs}), withClient(Config{}))
	srv, good := e.server, e.conn
	path, _ := shm.ParseTarget(e.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stop := make(chan struct{})
	goodErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				goodErr <- nil
				return
			default:
			}
			resp, err := good.Call(ctx, []byte("good"))
			if err != nil {
				goodErr <- err
				return
			}
			resp.Release()
		}
	}()

	// Garbage instead of a hello.
	nc, err := shm.Dial(ctx, path, shm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = nc.Write([]byte(strings.Repeat("\xee", 64)))
	waitFor(t, "the garbage hello's setup to fail", func() bool { return srv.Stats().SetupFailed >= 1 })
	nc.Close()

	// Garbage frames after a proper setup.
	adev, _ := soft.OpenTCP("attacker")
	defer adev.Close()
	atr, err := New(adev, nil, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer atr.Close()
	nc, err = shm.Dial(ctx, path, shm.Config{})
	if err != nil {
		t.Fatal(err)
	}
	inj := injector{nc}
	ac, err := atr.NewConn(ctx, inj)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := ac.Call(ctx, []byte("before")); err != nil {
		t.Fatalf("the attacker's first call: %v", err)
	} else {
		resp.Release()
	}
	if err := inj.inject([]byte(strings.Repeat("\xee", 64))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the garbage frames to be counted", func() bool { return srv.Stats().Protocol >= 1 })
	waitFor(t, "the attacker's connection to end", func() bool { return ac.Err() != nil })
	if _, err := ac.Call(ctx, []byte("after")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the attacker's call after its garbage: %v, want ErrUnavailable", err)
	}

	close(stop)
	if err := <-goodErr; err != nil {
		t.Fatalf("the good client's call failed during the attacks: %v", err)
	}
	waitFor(t, "the server to settle", func() bool {
		st := srv.Stats()
		return st.Conns == 1 && st.WindowsExposed == 0 && st.Handlers == 0
	})
	mu.Lock()
	text := logs.String()
	mu.Unlock()
	for _, want := range []string{"connection setup failed", "the peer broke the protocol", "malformed frame"} {
		if !strings.Contains(text, want) {
			t.Errorf("the server's log lacks %q:\n%s", want, text)
		}
	}
}

var _ net.Conn = injector{}
