package idle

import (
	"testing"
	"time"
)

// TestSpinner: the spin budget halves after a spin that ended in sleep, down to
// SpinFloor, and doubles back to its max after spins that found what they waited for; a
// Spinner of max 0 never spins.
func TestSpinner(t *testing.T) {
	for _, tc := range []struct {
		name  string
		max   time.Duration
		steps string // w: won, l: lost
		want  time.Duration
	}{
		{"fresh", 20 * time.Microsecond, "", 20 * time.Microsecond},
		{"one loss", 20 * time.Microsecond, "l", 10 * time.Microsecond},
		{"losses stop at the floor", 20 * time.Microsecond, "llllllll", SpinFloor},
		{"wins grow it back", 20 * time.Microsecond, "llllllllwww", 16 * time.Microsecond},
		{"and no further than max", 20 * time.Microsecond, "llllllllwwwwww", 20 * time.Microsecond},
		{"no spinning configured", 0, "lwlw", 0},
		{"a max below the floor", time.Microsecond, "lll", time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSpinner(tc.max)
			for _, c := range tc.steps {
				if c == 'w' {
					s.Won()
				} else {
					s.Lost()
				}
			}
			if got := s.Budget(); got != tc.want {
				t.Fatalf("budget %v, want %v", got, tc.want)
			}
		})
	}
}
