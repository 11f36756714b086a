package verbstest

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// postSend posts wrs on qp; a post-time error is a failure of the case.
func (e *env) postSend(qp verbs.QP, wrs ...verbs.SendWR) {
	e.t.Helper()
	if err := qp.PostSend(wrs); err != nil {
		e.Fatalf("post_send of %d WR(s) on QP %d (%v): %v", len(wrs), qp.Num(), qp.State(), err)
	}
}

// postRecv posts wrs on qp; a post-time error is a failure of the case.
func (e *env) postRecv(qp verbs.QP, wrs ...verbs.RecvWR) {
	e.t.Helper()
	if err := qp.PostRecv(wrs); err != nil {
		e.Fatalf("post_recv of %d WR(s) on QP %d (%v): %v", len(wrs), qp.Num(), qp.State(), err)
	}
}

// postSRQRecv posts wrs to srq; a post-time error is a failure of the case.
func (e *env) postSRQRecv(srq verbs.SRQ, wrs ...verbs.RecvWR) {
	e.t.Helper()
	if err := srq.PostRecv(wrs); err != nil {
		e.Fatalf("post_srq_recv of %d WR(s): %v", len(wrs), err)
	}
}

// pollN polls cq until exactly n completions arrived (it never takes more than n from the
// queue) and returns them in order. Not getting them within the timeout fails the case:
// no wait in the suite can hang.
func (e *env) pollN(cq verbs.CQ, n int, what string) []verbs.WorkCompletion {
	e.t.Helper()
	out, err := pollUntil(cq, n, e.timeout)
	e.record(out)
	if err != nil {
		e.Fatalf("%s: %v; got %s", what, err, fmtWCs(out))
	}
	return out
}

// poll1 waits for one completion.
func (e *env) poll1(cq verbs.CQ, what string) verbs.WorkCompletion {
	e.t.Helper()
	return e.pollN(cq, 1, what)[0]
}

// pollUntil is pollN without a test: it is safe in any goroutine.
func pollUntil(cq verbs.CQ, n int, timeout time.Duration) ([]verbs.WorkCompletion, error) {
	out := make([]verbs.WorkCompletion, 0, n)
	buf := make([]verbs.WorkCompletion, min(n, 64))
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Microsecond
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		if err != nil {
			return out, fmt.Errorf("poll: %w", err)
		}
		if k > 0 {
			out = append(out, buf[:k]...)
			pause = 5 * time.Microsecond
			continue
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("%d of %d completion(s) within %v", len(out), n, timeout)
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
	return out, nil
}

// expectNoWC polls cq for d and fails the case if any completion arrives.
func (e *env) expectNoWC(cq verbs.CQ, d time.Duration, what string) {
	e.t.Helper()
	var got []verbs.WorkCompletion
	buf := make([]verbs.WorkCompletion, 16)
	deadline := time.Now().Add(d)
	for {
		k, err := cq.Poll(buf)
		if err != nil {
			e.Errorf("%s: poll: %v", what, err)
			break
		}
		got = append(got, buf[:k]...)
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	e.record(got)
	if len(got) > 0 {
		e.Errorf("%s: want no completion within %v, got %s", what, d, fmtWCs(got))
	}
}

// waitState waits until qp is in state want, within the timeout. It reports whether it got
// there (an unmet wait is a failure of the case).
func (e *env) waitState(qp verbs.QP, want verbs.QPState, what string) bool {
	e.t.Helper()
	deadline := time.Now().Add(e.timeout)
	for {
		s := qp.State()
		if s == want {
			return true
		}
		if time.Now().After(deadline) {
			e.Errorf("%s: QP %d is in %v after %v, want %v", what, qp.Num(), s, e.timeout, want)
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// wantState checks qp's state now.
func (e *env) wantState(qp verbs.QP, want verbs.QPState, what string) {
	e.t.Helper()
	if s := qp.State(); s != want {
		e.Errorf("%s: QP %d is in %v, want %v", what, qp.Num(), s, want)
	}
}

// checkWC checks a completion's WRID, QP number and status and, for a successful one,
// its opcode (the only fields defined for an error completion are WRID, status and QP).
// It reports whether all matched.
func (e *env) checkWC(what string, wc verbs.WorkCompletion, qp verbs.QP, wrid uint64, st verbs.WCStatus, op verbs.WCOpcode) bool {
	e.t.Helper()
	var bad []string
	if wc.Status != st {
		bad = append(bad, fmt.Sprintf("status %v, want %v", wc.Status, st))
	}
	if wc.WRID != wrid {
		bad = append(bad, fmt.Sprintf("wrid %d, want %d", wc.WRID, wrid))
	}
	if qp != nil && wc.QPNum != qp.Num() {
		bad = append(bad, fmt.Sprintf("qp %d, want %d", wc.QPNum, qp.Num()))
	}
	if st == verbs.WCSuccess && wc.Status == verbs.WCSuccess && wc.Opcode != op {
		bad = append(bad, fmt.Sprintf("opcode %v, want %v", wc.Opcode, op))
	}
	if len(bad) > 0 {
		e.Errorf("%s: %v: %s", what, wc, strings.Join(bad, "; "))
		return false
	}
	return true
}

// wantBytes checks that got equals want, naming the first difference.
func (e *env) wantBytes(what string, got, want []byte) bool {
	e.t.Helper()
	if bytes.Equal(got, want) {
		return true
	}
	if len(got) != len(want) {
		e.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
		return false
	}
	i := 0
	for got[i] == want[i] {
		i++
	}
	e.Errorf("%s: data differs from byte %d on: got % x..., want % x...", what, i, got[i:min(i+8, len(got))], want[i:min(i+8, len(want))])
	return false
}

func fmtWCs(wcs []verbs.WorkCompletion) string {
	if len(wcs) == 0 {
		return "none"
	}
	parts := make([]string, len(wcs))
	for i, wc := range wcs {
		parts[i] = wc.String()
	}
	return strings.Join(parts, ", ")
}
