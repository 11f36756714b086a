// Package verbstest is the provider-independent conformance suite of the verbs model. It
// runs the cases of the design brief's "Conformance cases" table (K1, B1..B6, R1..R6,
// I1..I5, O1..O5, S1, S2) and the data-path, key-rotation, concurrency and API-misuse cases
// below against any provider, through the verbs interfaces alone:
//
//	func TestConformance(t *testing.T) {
//		fab := soft.NewFabric()
//		verbstest.Run(t, verbstest.Fixture{
//			Name: "inproc",
//			Open: func(t testing.TB) verbs.Device { d, err := fab.Open("soft"); ...; return d },
//		})
//	}
//
// Run creates one subtest named Fixture.Name, and below it one subtest per case named
// "<caseID>_<short_name>", so that `go test -run Conformance -v` prints, for example,
// TestConformance/inproc/B1_bind_type2 and `-run 'Conformance/tcp/R2'` selects every R2
// variant of the TCP fabric. Rows of the table that list several setups are split into
// lettered cases (B3a_mr_without_mw_bind ... B3e_stale_key). The cases run one after the
// other; do not call Run from a parallel test, because the suite as a whole fails on leaked
// goroutines.
//
// # Cases
//
// K1, B1..B6, R1..R6, I1..I5, O1..O4 and S1..S2 are the cases of the conformance table in
// docs/verbs.md (binding, READ, invalidation, ordering, SEND). The other groups are:
//
//	D1..D6  data path: SEND/RECV with several SGEs and byte_len, SEND_WITH_IMM, RDMA WRITE,
//	        WRITE_WITH_IMM, CQ events, type-1 windows
//	W1      1000 rebinds of one type-2 window, and what an 8-bit key8 means for old rkeys
//	P1      8 QP pairs with SENDs and READs posted and reaped from several goroutines
//	M1..M8  API misuse: post in RESET/INIT, full queues, double release, RegMR of Go heap
//	        memory, invalid QP transitions, access-flag and SGE-count checks
//	Q1..Q7  shared receive queues: receives taken in post order by the QPs of two peers,
//	        RNR while the SRQ is empty, PostRecv refused on an SRQ's QP, receives kept
//	        when a QP is destroyed or errs, Destroy refused while in use, SEND_WITH_INV
//	        through an SRQ, the SRQ limit event
//
// CaseIDs lists them all. No case invalidates one binding twice (by LOCAL_INV or
// SEND_WITH_INV): rxe's double-invalidation path dereferences freed state in the kernel.
//
// # Roles
//
// Most cases open two devices ("hosts") and connect one queue pair on each with cm.Connect
// over a loopback TCP connection. C owns the memory and binds windows; S issues READs and
// SEND_WITH_INVs on its QP, as in the conformance table.
//
// # Expectations
//
// The expectations are the IBTA's (with facts from the rdma-core man pages and rxe's code):
// an error completion moves the QP to ERR and every work request outstanding or posted
// afterwards completes with WR_FLUSH_ERR; post-time errors are verbs errors matched with
// errors.Is (verbs.ErrInvalid, verbs.ErrQueueFull, verbs.ErrClosed, verbs.ErrBusy,
// verbs.ErrNotMapped). No wait is unbounded: a completion that does not arrive within
// Fixture.Timeout fails the case.
//
// A provider that deviates from the IBTA on purpose (ibv on rxe, for R6) names the case in
// Fixture.Divergent. Such a case still runs in full: each unmet IBTA expectation is logged
// instead of failing the test, the observed completions are logged, and
// Fixture.DivergentCheck, when it has an entry for the case, checks the provider's
// documented behaviour instead. A divergent case is never skipped.
//
// # Resources
//
// Every object a case creates (QPs, MWs, MRs, mappings, CQs, PDs, devices) is released at
// the end of the case, in dependency order, and each release must succeed.
package verbstest

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// Fixture describes a provider and fabric under test.
type Fixture struct {
	// Name names the fabric, for example "inproc", "tcp" or "rxe". It is the name of the
	// subtest Run creates.
	Name string
	// Open opens a fresh device: one host. Devices opened by one fixture must be able to
	// connect queue pairs to each other with cm.Connect. The suite closes every device it
	// opens. Open reports its own failures with t.Fatal.
	Open func(t testing.TB) verbs.Device
	// Divergent maps a case ID to the reason the provider is known to deviate from the
	// IBTA there. The key is either a full case ID ("R2c") or a table row ("R2"), which
	// covers every lettered case of the row. A divergent case still runs; its unmet IBTA
	// expectations are logged, not failed.
	Divergent map[string]string
	// DivergentCheck optionally maps a key of Divergent to a check of the provider's
	// documented behaviour, called with what the case observed. Its failures are real
	// test failures.
	DivergentCheck map[string]func(t testing.TB, o Observation)
	// Timeout bounds every wait for a completion, a state change or a connection. Zero
	// means 5 s.
	Timeout time.Duration
	// Pipe, when not nil, makes the connected pair of streams cm.Connect runs over for
	// each queue pair the suite connects, instead of a loopback TCP connection: for a
	// fabric whose queue pairs take a stream of their own kind (the shm fabric's rings).
	// It reports its own failures with t.Fatal; the suite closes what it returns.
	Pipe func(t testing.TB) (a, b net.Conn)
}

// Observation is what a divergent case saw, for Fixture.DivergentCheck.
type Observation struct {
	Case   string // the case ID, for example "R6"
	Reason string // the fixture's reason
	// Completions are all work completions the case polled, on every CQ, in the order
	// they were polled.
	Completions []verbs.WorkCompletion
	// Mismatches are the IBTA expectations the provider did not meet, as messages; empty
	// if the provider behaved as the IBTA says after all.
	Mismatches []string
	// Stopped reports that an unmet expectation ended the case early (a completion the
	// IBTA requires never came, for instance).
	Stopped bool
}

// testCase is one conformance case.
type testCase struct {
	id   string // "B3a"
	name string // "mr_without_mw_bind"
	run  func(e *env)
}

// allCases lists the cases in the order they run.
func allCases() []testCase {
	var cs []testCase
	cs = append(cs, keyCases()...)
	cs = append(cs, bindCases()...)
	cs = append(cs, readCases()...)
	cs = append(cs, invCases()...)
	cs = append(cs, orderCases()...)
	cs = append(cs, rnrCases()...)
	cs = append(cs, dataCases()...)
	cs = append(cs, rotationCases()...)
	cs = append(cs, concurrencyCases()...)
	cs = append(cs, misuseCases()...)
	cs = append(cs, srqCases()...)
	cs = append(cs, domainCases()...)
	cs = append(cs, cqCases()...)
	return cs
}

// CaseIDs returns the IDs of all cases, in the order Run runs them.
func CaseIDs() []string {
	var ids []string
	for _, c := range allCases() {
		ids = append(ids, c.id)
	}
	return ids
}

// rowOf returns the table row of a case ID: "R2c" -> "R2".
func rowOf(id string) string {
	if n := len(id); n > 2 && id[n-1] >= 'a' && id[n-1] <= 'z' {
		return id[:n-1]
	}
	return id
}

// Run runs the conformance suite against f as the subtest t.Run(f.Name, ...), with one
// subtest per case below it. See the package documentation.
func Run(t *testing.T, f Fixture) {
	t.Helper()
	name := f.Name
	if name == "" {
		name = "unnamed"
	}
	t.Run(name, func(t *testing.T) {
		if f.Name == "" {
			t.Fatal("verbstest: Fixture.Name is empty")
		}
		if f.Open == nil {
			t.Fatal("verbstest: Fixture.Open is nil")
		}
		if f.Timeout <= 0 {
			f.Timeout = 5 * time.Second
		}
		cases := allCases()
		known := make(map[string]bool)
		for _, c := range cases {
			known[c.id] = true
			known[rowOf(c.id)] = true
		}
		for id := range f.Divergent {
			if !known[id] {
				t.Errorf("verbstest: Fixture.Divergent names unknown case %q", id)
			}
		}
		for id := range f.DivergentCheck {
			if _, ok := f.Divergent[id]; !ok {
				t.Errorf("verbstest: Fixture.DivergentCheck has %q, which Fixture.Divergent does not name", id)
			}
		}
		checkGoroutines(t)
		for _, c := range cases {
			t.Run(c.id+"_"+c.name, func(t *testing.T) { runCase(t, &f, c) })
		}
	})
}

// divergence returns the fixture's divergence reason for a case and the key it was
// found under.
func (f *Fixture) divergence(id string) (key, reason string) {
	if r, ok := f.Divergent[id]; ok {
		return id, r
	}
	if r, ok := f.Divergent[rowOf(id)]; ok {
		return rowOf(id), r
	}
	return "", ""
}

func runCase(t *testing.T, f *Fixture, c testCase) {
	e := &env{t: t, f: f, id: c.id, timeout: f.Timeout}
	key, reason := f.divergence(c.id)
	e.divergent = reason
	if reason != "" {
		t.Logf("%s is marked divergent for %s: %s. The IBTA expectations below are logged, not enforced.", c.id, f.Name, reason)
	}
	stopped := e.call(c.run)
	if reason == "" {
		return
	}
	e.mu.Lock()
	o := Observation{Case: c.id, Reason: reason, Completions: append([]verbs.WorkCompletion(nil), e.wcs...),
		Mismatches: append([]string(nil), e.mismatches...), Stopped: stopped}
	e.mu.Unlock()
	var sb strings.Builder
	for _, wc := range o.Completions {
		fmt.Fprintf(&sb, "\n\t%v", wc)
	}
	if len(o.Mismatches) == 0 {
		t.Logf("DIVERGENT %s (%s): the provider met every IBTA expectation of the case after all; completions:%s", c.id, reason, sb.String())
	} else {
		t.Logf("DIVERGENT %s (%s): %d IBTA expectation(s) unmet (stopped early: %v); completions:%s", c.id, reason, len(o.Mismatches), stopped, sb.String())
	}
	if chk := f.DivergentCheck[key]; chk != nil {
		chk(t, o)
	}
}

// stopCase is the panic value that ends a divergent case at an unmet fatal expectation.
type stopCase struct{}

// env is the state of one running case.
type env struct {
	t         *testing.T
	f         *Fixture
	id        string
	divergent string
	timeout   time.Duration

	mu         sync.Mutex
	wcs        []verbs.WorkCompletion
	mismatches []string

	wrid atomic.Uint64
}

func (e *env) call(fn func(*env)) (stopped bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopCase); ok {
				stopped = true
				return
			}
			panic(r)
		}
	}()
	fn(e)
	return false
}

// Errorf reports an unmet expectation: a test failure, or a log line in a divergent case.
func (e *env) Errorf(format string, args ...any) {
	e.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if e.divergent != "" {
		e.mu.Lock()
		e.mismatches = append(e.mismatches, msg)
		e.mu.Unlock()
		e.t.Logf("divergent (not failed): %s", msg)
		return
	}
	e.t.Error(msg)
}

// Fatalf reports an unmet expectation after which the case cannot go on.
func (e *env) Fatalf(format string, args ...any) {
	e.t.Helper()
	if e.divergent != "" {
		e.Errorf(format, args...)
		panic(stopCase{})
	}
	e.t.Fatalf(format, args...)
}

// Logf logs.
func (e *env) Logf(format string, args ...any) {
	e.t.Helper()
	e.t.Logf(format, args...)
}

// setupf reports a failure of the test's own setup: always a real failure, divergent or not.
func (e *env) setupf(format string, args ...any) {
	e.t.Helper()
	e.t.Fatalf("setup: "+format, args...)
}

// newWRID returns a work request ID unique within the case.
func (e *env) newWRID() uint64 { return 1000 + e.wrid.Add(1) }

func (e *env) record(wcs []verbs.WorkCompletion) {
	e.mu.Lock()
	e.wcs = append(e.wcs, wcs...)
	e.mu.Unlock()
}

// checkGoroutines fails t, after its subtests and cleanups, if more goroutines run than
// when it was called, printing their stacks. It lets them settle for up to 5 s first.
func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		n := runtime.NumGoroutine()
		for n > before && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			n = runtime.NumGoroutine()
		}
		if n <= before {
			return
		}
		buf := make([]byte, 1<<20)
		for {
			k := runtime.Stack(buf, true)
			if k < len(buf) {
				buf = buf[:k]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		t.Errorf("goroutine leak: %d goroutines before the suite, %d after it (5 s to settle); all stacks:\n%s", before, n, buf)
	})
}
