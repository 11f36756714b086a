package transport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func ping(c *Conn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Ping(ctx)
}

// waitAway waits for GOAWAY on c and returns why it came.
func waitAway(t *testing.T, c *Conn, within time.Duration) error {
	t.Helper()
	select {
	case <-c.GoingAway():
		return c.GoAwayErr()
	case <-time.After(within):
		t.Fatalf("no GOAWAY within %v", within)
		return nil
	}
}

func waitDone(t *testing.T, c *Conn, within time.Duration) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(within):
		t.Fatalf("the connection is still open after %v", within)
	}
}

// TestTooManyPings: a client that pings more often than the server's policy allows gets
// two strikes free; the third sends GOAWAY saying why, the ping goes unanswered, the
// server counts it, and closes the connection.
func TestTooManyPings(t *testing.T) {
	cases := []struct {
		name string
		ka   ServerKeepalive
	}{
		{"calls in flight or not", ServerKeepalive{MinPingInterval: time.Hour, PermitWithoutCalls: true}},
		{"no call in flight: two hours", ServerKeepalive{MinPingInterval: time.Millisecond}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, fabrics[1], echo, Config{Keepalive: tc.ka})
			for i := range 3 {
				if err := ping(e.conn, 5*time.Second); err != nil {
					t.Fatalf("ping %d (of the first three: a strike at most): %v", i+1, err)
				}
			}
			if err := ping(e.conn, 200*time.Millisecond); err == nil {
				t.Fatal("the fourth ping (third strike) was answered")
			}
			why := waitAway(t, e.conn, 5*time.Second)
			if !errors.Is(why, ErrTooManyPings) || !strings.Contains(why.Error(), "this server allows a ping every") {
				t.Errorf("GOAWAY's reason: %v; want ErrTooManyPings with the server's policy", why)
			}
			waitDone(t, e.conn, 5*time.Second)
			if n := e.server.Stats().TooManyPings; n != 1 {
				t.Errorf("Stats.TooManyPings = %d, want 1", n)
			}
		})
	}
}

// TestPingsWithRequestsBetween: a request between pings forgives the strikes, and a
// policy of -1 does not limit pings at all.
func TestPingsWithRequestsBetween(t *testing.T) {
	for _, ka := range []ServerKeepalive{{MinPingInterval: time.Hour, PermitWithoutCalls: true}, {MinPingInterval: -1}} {
		e := newEnv(t, fabrics[1], echo, Config{Keepalive: ka})
		for i := range 8 {
			if err := ping(e.conn, 5*time.Second); err != nil {
				t.Fatalf("%+v: ping %d: %v", ka, i+1, err)
			}
			if ka.MinPingInterval > 0 {
				resp, err := e.conn.Call(context.Background(), []byte("x"))
				if err != nil {
					t.Fatal(err)
				}
				resp.Release()
			}
		}
		select {
		case <-e.conn.GoingAway():
			t.Fatalf("%+v: GOAWAY: %v", ka, e.conn.GoAwayErr())
		default:
		}
	}
}

// TestMaxConnectionAge: a connection past its age (give or take 10%) is sent GOAWAY
// saying so, and closed after the grace even with a call in flight.
func TestMaxConnectionAge(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	e := newEnv(t, fabrics[1], blockingHandler(block), Config{Keepalive: ServerKeepalive{MaxConnectionAge: 200 * time.Millisecond, MaxConnectionAgeGrace: 300 * time.Millisecond}})
	t0 := time.Now()
	done := make(chan error, 1)
	go func() {
		resp, err := e.conn.Call(context.Background(), []byte("held"))
		if err == nil {
			resp.Release()
		}
		done <- err
	}()
	why := waitAway(t, e.conn, 5*time.Second)
	if !errors.Is(why, ErrMaxConnectionAge) {
		t.Errorf("GOAWAY's reason: %v; want ErrMaxConnectionAge", why)
	}
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Errorf("GOAWAY after %v, well before the age (200ms less 10%%)", d)
	}
	if err := <-done; !errors.Is(err, ErrUnavailable) {
		t.Errorf("the call held past the grace: %v; want ErrUnavailable", err)
	}
	waitDone(t, e.conn, 5*time.Second)
}
