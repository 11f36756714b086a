package soft

import "testing"

// TestPosterLeavesToHolder: a poster that finds another goroutine transmitting leaves its
// work requests to that one and wakes no engine; the holder is asked for another round
// when it lets go, and only then.
func TestPosterLeavesToHolder(t *testing.T) {
	q := bareQP()
	q.wake = make(chan struct{}, 1)
	if !q.takeTx() {
		t.Fatal("takeTx failed with txMu free")
	}
	if q.letGoTx() {
		t.Fatal("letGoTx asked for another round though no poster came")
	}

	q.txMu.Lock() // another goroutine transmits
	q.transmitInline(nil)
	if len(q.wake) != 0 {
		t.Fatal("a poster that found txMu held woke the engine")
	}
	if !q.letGoTx() {
		t.Fatal("the holder was not asked for another round after a poster found txMu held")
	}
	if !q.takeTx() || q.letGoTx() {
		t.Fatal("the next holder's round did not clear the request")
	}
}
