package rpc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/mwrpc/mwrpc/transport"
)

// TestOneStatusModel checks that transport and rpc share one code type and one
// ErrUnavailable: errors.Is answers the same whichever package names the sentinel, for an
// error the transport made and for a status a server sent.
func TestOneStatusModel(t *testing.T) {
	if Unavailable != transport.StatusUnavailable || ResourceExhausted != transport.StatusResourceExhausted {
		t.Fatalf("rpc and transport disagree on code numbers")
	}
	if got := fmt.Sprint(NotFound, transport.StatusInternal, Code(99)); got != "NotFound Internal Code(99)" {
		t.Errorf("codes print as %q", got)
	}
	connErr := fmt.Errorf("mwrpc: call: %w", transport.ErrUnavailable)
	sent := &Status{Code: Unavailable, Message: "the server is draining"}
	other := &Status{Code: Internal, Message: "boom"}
	for _, tc := range []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"transport error is rpc.ErrUnavailable", connErr, ErrUnavailable, true},
		{"transport error is transport.ErrUnavailable", connErr, transport.ErrUnavailable, true},
		{"its status is rpc.ErrUnavailable", StatusOf(connErr), ErrUnavailable, true},
		{"its status is transport.ErrUnavailable", StatusOf(connErr), transport.ErrUnavailable, true},
		{"a server's Unavailable is transport.ErrUnavailable", sent, transport.ErrUnavailable, true},
		{"a server's Unavailable is rpc.ErrUnavailable", sent, ErrUnavailable, true},
		{"Internal is not transport.ErrUnavailable", other, transport.ErrUnavailable, false},
		{"transport error is not rpc.ErrInternal", connErr, ErrInternal, false},
		{"a context error is not ErrUnavailable", context.Canceled, transport.ErrUnavailable, false},
	} {
		if got := errors.Is(tc.err, tc.target); got != tc.want {
			t.Errorf("%s: errors.Is = %v, want %v", tc.name, got, tc.want)
		}
	}
	if c := CodeOf(connErr); c != Unavailable {
		t.Errorf("CodeOf(transport error) = %v, want Unavailable", c)
	}
}
