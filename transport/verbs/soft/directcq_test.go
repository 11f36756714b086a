package soft

import (
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// TestArmedHandler checks verbs.DirectCQ: on the TCP fabric the stream reader that fills an
// armed queue runs the handler instead of sending a Notify token (and posters meanwhile
// send only with writes that never wait, or leave it to the engines); the in-process
// fabric keeps notifying; a queue that is not armed does neither.
func TestArmedHandler(t *testing.T) {
	for name, open := range fabrics(t) {
		t.Run(name, func(t *testing.T) {
			c, s := newHost(t, open("c"), 1<<16), newHost(t, open("s"), 1<<16)
			defer c.close(t)
			defer s.close(t)
			connect(t, c, s)

			type call struct {
				wcs     []verbs.WorkCompletion
				reaping int32
			}
			calls := make(chan call, 4)
			dcq, ok := s.cq.(verbs.DirectCQ)
			if !ok {
				t.Fatal("soft CQ does not implement verbs.DirectCQ")
			}
			dcq.SetArmedHandler(func() {
				var wcs [4]verbs.WorkCompletion
				n, err := s.cq.Poll(wcs[:])
				if err != nil {
					t.Error(err)
				}
				calls <- call{append([]verbs.WorkCompletion(nil), wcs[:n]...), s.dev.readersReaping.Load()}
			})
			defer dcq.SetArmedHandler(nil)
			for i := 0; i < 2; i++ {
				must(t, s.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGL: []verbs.SGE{verbs.SGEFor(s.mr, 64*i, 64)}}}))
			}
			send := func(id uint64) {
				must(t, c.qp.PostSend([]verbs.SendWR{{WRID: id, Opcode: verbs.WRSend, Flags: verbs.SendInline, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 0, 8)}}}))
			}

			must(t, s.cq.ReqNotify())
			send(100)
			select {
			case got := <-calls:
				if name != "tcp" {
					t.Fatalf("handler ran on the %s fabric; want a Notify token", name)
				}
				if len(got.wcs) != 1 || got.wcs[0].WRID != 0 || got.wcs[0].Opcode != verbs.WCRecv || got.wcs[0].ByteLen != 8 {
					t.Fatalf("handler polled %+v; want the receive of WRID 0", got.wcs)
				}
				if got.reaping != 1 {
					t.Fatalf("readersReaping = %d inside the handler; want 1", got.reaping)
				}
				select {
				case <-s.cq.Notify():
					t.Fatal("a Notify token besides the handler")
				default:
				}
			case <-s.cq.Notify():
				if name == "tcp" {
					t.Fatal("Notify token on the TCP fabric; want the reader to run the handler")
				}
				if wc := s.poll(t); wc.WRID != 0 {
					t.Fatalf("completion %+v; want the receive of WRID 0", wc)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("neither the handler nor Notify within 5s")
			}
			// The reader leaves the reaping count once the handler has returned, which is
			// after the handler sent on calls: give it that moment.
			for deadline := time.Now().Add(5 * time.Second); s.dev.readersReaping.Load() != 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("readersReaping = %d 5s after the handler", s.dev.readersReaping.Load())
				}
			}

			// Not armed: the completion waits in the queue.
			send(101)
			if wc := s.poll(t); wc.WRID != 1 {
				t.Fatalf("completion %+v; want the receive of WRID 1", wc)
			}
			select {
			case got := <-calls:
				t.Fatalf("handler ran for a queue that was not armed: %+v", got.wcs)
			case <-s.cq.Notify():
				t.Fatal("Notify token for a queue that was not armed")
			case <-time.After(20 * time.Millisecond):
			}
		})
	}
}

// TestArmedHandlerPausedReader: a reader holds back an armed queue's notification only while
// it delivers, not while it waits for payload bytes (connSource.fill ends its bracket and
// begins another): a completion held back before the wait goes to the handler first, one
// added during the wait gets its token.
func TestArmedHandlerPausedReader(t *testing.T) {
	dev, err := OpenTCP("d")
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	vcq, err := dev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	defer vcq.Destroy()
	c := vcq.(*cq)
	ran := 0
	c.SetArmedHandler(func() { ran++ })
	token := func() bool {
		select {
		case <-c.Notify():
			return true
		default:
			return false
		}
	}
	wc := verbs.WorkCompletion{WRID: 1}
	for _, tc := range []struct {
		name             string
		pushWhilePaused  bool
		wantTokenAtPause bool
		wantTokenAtPush  bool
		wantHandler      int
	}{
		{"pushed while delivering, then the reader waits", false, false, false, 1},
		{"pushed while the reader waits", true, false, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran = 0
			must(t, c.ReqNotify())
			c.beginDefer()
			if !tc.pushWhilePaused {
				c.push(wc)
			}
			c.endDefer()
			if got := token(); got != tc.wantTokenAtPause {
				t.Fatalf("token at pause: %v, want %v", got, tc.wantTokenAtPause)
			}
			if tc.pushWhilePaused {
				c.push(wc)
				if got := token(); got != tc.wantTokenAtPush {
					t.Fatalf("token at push: %v, want %v", got, tc.wantTokenAtPush)
				}
			}
			if ran != tc.wantHandler {
				t.Fatalf("handler ran %d times by the end of the wait, want %d", ran, tc.wantHandler)
			}
			c.beginDefer()
			c.endDefer()
			if ran != tc.wantHandler || token() {
				t.Fatalf("handler ran %d times (want %d), or a second token", ran, tc.wantHandler)
			}
			var wcs [4]verbs.WorkCompletion
			if n, _ := c.Poll(wcs[:]); n != 1 {
				t.Fatalf("polled %d completions, want 1", n)
			}
		})
	}
}
