package soft

import (
	"sync"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestThreadDomainMisuse: posts from two goroutines at once to the QPs of one thread
// domain are counted as misuse (and, under the race detector, reported as a data race:
// this test runs without it); posts from one goroutine at a time, handed over with a
// channel, are not.
func TestThreadDomainMisuse(t *testing.T) {
	if raceEnabled {
		t.Skip("two goroutines posting to one thread domain at once is the data race the race detector reports: this test checks the count without it")
	}
	d := mustOpen(t)
	defer d.Close()
	pd, _ := d.AllocPD()
	defer pd.Dealloc()
	cq, _ := d.CreateCQ(64)
	defer cq.Destroy()
	tdom, err := verbs.AllocTD(d)
	if err != nil {
		t.Fatal(err)
	}
	defer tdom.Dealloc()
	pdom, err := verbs.AllocParentDomain(d, verbs.ParentDomainAttr{PD: pd, TD: tdom})
	if err != nil {
		t.Fatal(err)
	}
	defer pdom.Dealloc()
	var qps [2]verbs.QP
	for i := range qps {
		qp, err := pdom.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Destroy()
		qps[i] = qp
	}
	td := tdom.(*td)
	// One goroutine at a time: the other waits for its turn on a channel.
	turn := make(chan struct{}, 1)
	turn <- struct{}{}
	var wg sync.WaitGroup
	for _, qp := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				<-turn
				_ = qp.PostRecv(nil)
				turn <- struct{}{}
			}
		}()
	}
	wg.Wait()
	if n := td.misuse.Load(); n != 0 {
		t.Fatalf("posts handed over one at a time counted %d overlaps, want none", n)
	}
	// Both at once, until an overlap is seen (each post holds its QP's lock a moment).
	stop := time.Now().Add(5 * time.Second)
	for _, qp := range qps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for td.misuse.Load() == 0 && time.Now().Before(stop) {
				_ = qp.PostRecv(nil)
			}
		}()
	}
	wg.Wait()
	if td.misuse.Load() == 0 {
		t.Error("two goroutines posting at once for 5 s: no overlap counted")
	}
}

// TestParentDomainChecks: a parent domain is made of a PD and a TD of its own device, not
// of another parent domain, and is deallocated once.
func TestParentDomainChecks(t *testing.T) {
	d, other := mustOpen(t), mustOpen(t)
	defer d.Close()
	defer other.Close()
	pd, _ := d.AllocPD()
	defer pd.Dealloc()
	opd, _ := other.AllocPD()
	defer opd.Dealloc()
	otd, _ := other.AllocTD()
	defer otd.Dealloc()
	if _, err := d.AllocParentDomain(verbs.ParentDomainAttr{PD: opd}); err == nil {
		t.Error("a parent domain of another device's PD was allocated")
	}
	if _, err := d.AllocParentDomain(verbs.ParentDomainAttr{PD: pd, TD: otd}); err == nil {
		t.Error("a parent domain with another device's TD was allocated")
	}
	pdom, err := d.AllocParentDomain(verbs.ParentDomainAttr{PD: pd})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AllocParentDomain(verbs.ParentDomainAttr{PD: pdom}); err == nil {
		t.Error("a parent domain of a parent domain was allocated")
	}
	if err := pdom.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := pdom.Dealloc(); err == nil {
		t.Error("a parent domain was deallocated twice")
	}
}
