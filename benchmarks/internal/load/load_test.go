package load

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	req, other := make([]byte, 64), make([]byte, 64)
	Request(req, 7, 0)
	Request(other, 8, 0)
	for _, tc := range []struct {
		name string
		resp []byte
		ok   bool
	}{
		{"its echo", append([]byte(nil), req...), true},
		{"another call's", other, false},
		{"cut short", req[:32], false},
		{"empty", nil, false},
	} {
		if err := Check(req, tc.resp); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrMismatch)) {
			t.Errorf("%s: Check = %v", tc.name, err)
		}
	}
}

func TestEchoDelay(t *testing.T) {
	req := make([]byte, RequestHeader+4)
	Request(req, 1, 20*time.Millisecond)
	t0 := time.Now()
	if out, err := (Server{}).Echo(context.Background(), req); err != nil || Check(req, out) != nil || time.Since(t0) < 20*time.Millisecond {
		t.Fatalf("Echo: %v after %v", err, time.Since(t0))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (Server{}).Echo(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("Echo with a canceled context: %v", err)
	}
	if _, err := (Server{}).Echo(context.Background(), req[:4]); err == nil {
		t.Fatal("Echo of a request shorter than its header: no error")
	}
}

func TestParseSizes(t *testing.T) {
	for in, want := range map[string][]int{"64": {64}, "64B, 4KiB,1MiB": {64, 4096, 1 << 20}, "2k,3M": {2048, 3 << 20}} {
		got, err := ParseSizes(in)
		if err != nil || len(got) != len(want) {
			t.Fatalf("ParseSizes(%q) = %v, %v", in, got, err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("ParseSizes(%q) = %v, want %v", in, got, want)
			}
		}
	}
	for _, in := range []string{"", "0", "-1", "x", "4GiB", "1,,y"} {
		if got, err := ParseSizes(in); err == nil {
			t.Errorf("ParseSizes(%q) = %v, no error", in, got)
		}
	}
}
