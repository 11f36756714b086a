package pool

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"time"
)

// ErrLeaked is matched by the error of CheckLeaks and Close when buffers were never
// released.
var ErrLeaked = errors.New("buffers never released")

// getRecord is what leak tracking keeps about a Get.
type getRecord struct {
	n   int
	at  time.Time
	pcs []uintptr
}

// newGetRecord records the caller of Get or TryGet.
func newGetRecord(n int) *getRecord {
	var pcs [32]uintptr
	k := runtime.Callers(3, pcs[:]) // skip runtime.Callers, newGetRecord, take
	return &getRecord{n: n, at: time.Now(), pcs: append([]uintptr(nil), pcs[:k]...)}
}

// Leak describes a buffer that is out: taken by Get and not yet released.
type Leak struct {
	Size  int       // class size
	Slab  int       // slab number in the class
	Slot  int       // buffer number in the slab
	Addr  uint64    // address of the buffer
	Len   int       // length asked of Get (leak tracking only; else 0)
	Since time.Time // when Get returned it (leak tracking only)
	Stack string    // the goroutine stack of that Get (leak tracking only)
}

// String describes the leak on one line, then the stack.
func (l Leak) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s buffer, slab %d slot %d, addr 0x%x", sizeString(int64(l.Size)), l.Slab, l.Slot, l.Addr)
	if l.Stack == "" {
		b.WriteString(" (set Config.TrackLeaks to see who took it)")
		return b.String()
	}
	fmt.Fprintf(&b, ", len %d, taken %v ago by:\n%s", l.Len, time.Since(l.Since).Round(time.Millisecond), l.Stack)
	return b.String()
}

// LeakError lists the buffers out at CheckLeaks or Close. It matches ErrLeaked.
type LeakError struct {
	Leaks []Leak
}

// Error lists the leaks, each with the stack that took it when tracking is on.
func (e *LeakError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pool: %d buffer(s) never released:", len(e.Leaks))
	for _, l := range e.Leaks {
		b.WriteString("\n  ")
		b.WriteString(strings.ReplaceAll(l.String(), "\n", "\n  "))
	}
	return b.String()
}

// Is reports whether target is ErrLeaked.
func (e *LeakError) Is(target error) bool { return target == ErrLeaked }

// Outstanding lists the buffers handed out and not yet released. It reads every buffer's
// state, so it costs time proportional to the pool's size: it is for tests and
// diagnostics.
func (p *Pool) Outstanding() []Leak {
	var out []Leak
	for _, c := range p.classes {
		n := int(c.nslabs.Load())
		for no := range n {
			sl := c.slabs[no].Load()
			for i := range sl.slots {
				s := &sl.slots[i]
				if wordState(s.word.Load())&1 == 0 {
					continue
				}
				l := Leak{Size: c.size, Slab: no, Slot: i, Addr: s.addr()}
				if r := s.taken.Load(); r != nil {
					l.Len, l.Since, l.Stack = r.n, r.at, formatStack(r.pcs)
				}
				out = append(out, l)
			}
		}
	}
	return out
}

// CheckLeaks returns nil if every buffer taken from the pool was released, and otherwise
// a *LeakError listing those out (with the stacks of their Gets when leak tracking is on).
// A test calls it, or Close, at teardown:
//
//	t.Cleanup(func() {
//		if err := p.Close(); err != nil {
//			t.Error(err)
//		}
//	})
func (p *Pool) CheckLeaks() error {
	if leaks := p.Outstanding(); len(leaks) > 0 {
		return &LeakError{Leaks: leaks}
	}
	return nil
}

// internalPrefixes name the pool's own methods on the way to take, left out of stacks.
var internalPrefixes = func() []string {
	name := runtime.FuncForPC(reflect.ValueOf(newGetRecord).Pointer()).Name()
	pkg := strings.TrimSuffix(name, "newGetRecord")
	return []string{pkg + "(*Pool).", pkg + "(*class)."}
}()

// formatStack formats program counters as a goroutine trace does, from the caller of Get.
func formatStack(pcs []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	caller := false
	for {
		f, more := frames.Next()
		if !caller && more && (strings.HasPrefix(f.Function, internalPrefixes[0]) || strings.HasPrefix(f.Function, internalPrefixes[1])) {
			continue
		}
		caller = true
		if strings.HasPrefix(f.Function, "testing.") || f.Function == "runtime.goexit" {
			break
		}
		fmt.Fprintf(&b, "    %s\n        %s:%d\n", f.Function, f.File, f.Line)
		if !more {
			break
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}
