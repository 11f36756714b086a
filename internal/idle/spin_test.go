package idle

import (
	"testing"
	"time"
)

// TestSpinner: the spin budget halves after a spin that ended in sleep, down to SpinFloor
// (a fitting one's becomes twice a wait that ended within its max), and doubles back to
// its max after spins that found what they waited for; a Spinner of max 0 never spins.
func TestSpinner(t *testing.T) {
	for _, tc := range []struct {
		name  string
		max   time.Duration
		fit   bool
		steps string // w: won, l: lost after a long wait, s: lost after a wait of 3 µs
		want  time.Duration
	}{
		{"fresh", 20 * time.Microsecond, false, "", 20 * time.Microsecond},
		{"one loss", 20 * time.Microsecond, false, "l", 10 * time.Microsecond},
		{"losses stop at the floor", 20 * time.Microsecond, false, "llllllll", SpinFloor},
		{"wins grow it back", 20 * time.Microsecond, false, "llllllllwww", 16 * time.Microsecond},
		{"and no further than max", 20 * time.Microsecond, false, "llllllllwwwwww", 20 * time.Microsecond},
		{"no spinning configured", 0, false, "lwlw", 0},
		{"a max below the floor", time.Microsecond, false, "lll", time.Microsecond},
		{"a short wait halves it too", 20 * time.Microsecond, false, "ls", 5 * time.Microsecond},
		{"fitting: a short wait grows it back at once", 20 * time.Microsecond, true, "lllllllls", 6 * time.Microsecond},
		{"fitting: to its max at most", 4 * time.Microsecond, true, "s", 4 * time.Microsecond},
		{"fitting: a long wait halves it", 20 * time.Microsecond, true, "l", 10 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSpinner(tc.max)
			if tc.fit {
				s = NewFitSpinner(tc.max)
			}
			for _, c := range tc.steps {
				switch c {
				case 'w':
					s.Won()
				case 's':
					s.Lost(3 * time.Microsecond)
				default:
					s.Lost(time.Second)
				}
			}
			if got := s.Budget(); got != tc.want {
				t.Fatalf("budget %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPoll: Poll returns once ready does, gives up after its budget, and, while quiet
// only, gives up as soon as the process is not quiet.
func TestPoll(t *testing.T) {
	calls := 0
	if _, ok := Poll(time.Second, 4, false, func() bool { calls++; return calls == 10 }); !ok || calls != 10 {
		t.Fatalf("Poll with ready true at the 10th call: ok %v after %d calls, want true after 10", ok, calls)
	}
	start, ok := Poll(time.Millisecond, 4, false, func() bool { return false })
	if waited := time.Since(start); ok || waited < time.Millisecond {
		t.Fatalf("Poll never ready, 1 ms budget: ok %v after %v, want false after at least 1 ms", ok, waited)
	}
	defer ForceQuiet(false)()
	calls = 0
	if _, ok := Poll(time.Minute, 4, true, func() bool { calls++; return false }); ok || calls != 4 {
		t.Fatalf("Poll while quiet, process busy: ok %v after %d calls, want false after one round of 4", ok, calls)
	}
}
