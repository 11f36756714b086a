package clock

import (
	"testing"
	"time"
)

// TestNanos: readings never go back, and they advance with time.
func TestNanos(t *testing.T) {
	prev := Nanos()
	if prev < 0 {
		t.Fatalf("Nanos = %d, want ≥ 0", prev)
	}
	for range 1000 {
		n := Nanos()
		if n < prev {
			t.Fatalf("Nanos went back: %d after %d", n, prev)
		}
		prev = n
	}
	time.Sleep(2 * time.Millisecond)
	if d := Nanos() - prev; d < int64(2*time.Millisecond) {
		t.Fatalf("Nanos advanced %v over a 2 ms sleep", time.Duration(d))
	}
}

// BenchmarkNanos against time.Now, which reads two clocks.
func BenchmarkNanos(b *testing.B) {
	b.Run("Nanos", func(b *testing.B) {
		for b.Loop() {
			_ = Nanos()
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			_ = time.Now().UnixNano()
		}
	})
}
