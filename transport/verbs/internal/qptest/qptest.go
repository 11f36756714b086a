// Package qptest gives the tests of the verbs providers' connection code (cm, shm) a queue
// pair to connect: a reliable-connected QP with its own protection domain and completion
// queue on a device the test hands over.
package qptest

import (
	"testing"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// New returns a fresh RC QP on dev, four WRs deep each way with one SGE, its send and
// receive completions on one CQ of 16. At the test's cleanup the QP, its CQ and PD are
// destroyed and dev is closed, each failure reported: New owns dev from here on.
func New(t testing.TB, dev verbs.Device) verbs.QP {
	t.Helper()
	qp, _ := NewWithCQ(t, dev)
	return qp
}

// NewWithCQ is New, also returning the QP's CQ, for tests that poll it.
func NewWithCQ(t testing.TB, dev verbs.Device) (verbs.QP, verbs.CQ) {
	t.Helper()
	return NewWithCap(t, dev, verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
}

// NewWithCap is NewWithCQ with the QP's capacities c (work requests and SGEs).
func NewWithCap(t testing.TB, dev verbs.Device, c verbs.QPCap) (verbs.QP, verbs.CQ) {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, err := range []error{qp.Destroy(), cq.Destroy(), pd.Dealloc(), dev.Close()} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	return qp, cq
}
