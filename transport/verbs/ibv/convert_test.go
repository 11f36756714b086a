//go:build ibverbs && linux && cgo

package ibv

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// These tests need no RDMA device.

func TestTimeoutCode(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 18}, {time.Nanosecond, 1}, {8192 * time.Nanosecond, 1}, {8193 * time.Nanosecond, 2},
		{67 * time.Millisecond, 14}, {68 * time.Millisecond, 15}, {time.Second, 18}, {time.Hour, 30}, {3 * time.Hour, 31},
	} {
		if got := timeoutCode(c.d); got != c.want {
			t.Errorf("timeoutCode(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestRNRTimerCode(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 1}, {10 * time.Microsecond, 1}, {11 * time.Microsecond, 2}, {60 * time.Microsecond, 5},
		{time.Millisecond, 14}, {1280 * time.Microsecond, 14}, {491520 * time.Microsecond, 31}, {500 * time.Millisecond, 0},
	} {
		if got := rnrTimerCode(c.d); got != c.want {
			t.Errorf("rnrTimerCode(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestMTUEnum(t *testing.T) {
	for _, c := range []struct{ bytes, active, want int }{
		{0, 1024, 3}, {256, 4096, 1}, {4096, 4096, 5}, {4096, 1024, 3}, {2048, 256, 1},
	} {
		got, err := mtuEnum(c.bytes, c.active)
		if err != nil || int(got) != c.want {
			t.Errorf("mtuEnum(%d, %d) = %d, %v; want %d", c.bytes, c.active, got, err, c.want)
		}
	}
	if _, err := mtuEnum(1500, 4096); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("mtuEnum(1500) error %v, want ErrInvalid", err)
	}
}

// TestWCFlags checks the translation of rxe's kernel-numbered completion flags.
func TestWCFlags(t *testing.T) {
	rxe := &cq{dev: &Device{rxe: true}}
	other := &cq{dev: &Device{}}
	for _, c := range []struct {
		q    *cq
		f    uint32
		want verbs.WCFlags
	}{
		{rxe, 1 | 1<<2, verbs.WCWithGRH | verbs.WCWithInv}, // IB_WC_GRH | IB_WC_WITH_INVALIDATE
		{rxe, 1<<1 | 1<<3, verbs.WCWithImm},                // IB_WC_WITH_IMM | IB_WC_IP_CSUM_OK
		{other, 1 << 3, verbs.WCWithInv},                   // IBV_WC_WITH_INV
		{other, 1<<2 | 1<<1, verbs.WCWithImm},              // IBV_WC_IP_CSUM_OK | IBV_WC_WITH_IMM
	} {
		if got := c.q.flags(c.f); got != c.want {
			t.Errorf("flags(%#x) with rxe %v = %#x, want %#x", c.f, c.q.dev.rxe, got, c.want)
		}
	}
}

func TestErrnoErr(t *testing.T) {
	for _, c := range []struct {
		e    syscall.Errno
		want error
	}{
		{syscall.EINVAL, verbs.ErrInvalid}, {syscall.EBUSY, verbs.ErrBusy}, {syscall.ENOMEM, verbs.ErrNoMemory},
		{syscall.EOPNOTSUPP, verbs.ErrUnsupported},
	} {
		err := errnoErr("op", c.e)
		if !errors.Is(err, c.want) || !errors.Is(err, c.e) {
			t.Errorf("errnoErr(%v) = %v, want it to match %v and the errno", c.e, err, c.want)
		}
	}
	if err := postErr(7, "post_send", syscall.ENOMEM); !errors.Is(err, verbs.ErrQueueFull) || !errors.Is(err, syscall.ENOMEM) {
		t.Errorf("postErr(ENOMEM) = %v, want ErrQueueFull wrapping ENOMEM", err)
	}
}
