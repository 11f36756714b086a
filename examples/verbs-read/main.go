// Command verbs-read uses the verbs layer directly, without the RPC layer: on an in-process
// soft fabric it connects two queue pairs, exposes a buffer of one side through a type-2
// memory window, READs it from the other side, and revokes the window with SEND_WITH_INV.
//
//	go run ./examples/verbs-read
//
// C is the side that owns the memory and binds the window (a server with a response); S
// is the side that READs it (the client).
package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// side is one end: a device with a PD, a CQ, a QP and a registered buffer.
type side struct {
	dev *soft.Device
	pd  verbs.PD
	cq  verbs.CQ
	qp  verbs.QP
	mem *verbs.Memory
	mr  verbs.MR
}

func main() {
	log.SetFlags(0)
	fab := soft.NewFabric()
	c := open(fab, "soft0", verbs.AccessLocalWrite|verbs.AccessMWBind)
	s := open(fab, "soft1", verbs.AccessLocalWrite)
	connect(c.qp, s.qp)
	fmt.Printf("connected QP %d (%s) <-> QP %d (%s) on an in-process soft fabric\n",
		c.qp.Num(), c.dev.Name(), s.qp.Num(), s.dev.Name())

	// C: the payload, and a receive for the peer's SEND_WITH_INV.
	payload := []byte("hello from registered memory, fetched by RDMA READ")
	n := copy(c.mr.Bytes(), payload)
	check(c.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGL: []verbs.SGE{verbs.SGEFor(c.mr, 4096, 64)}}}))

	// C: bind a type-2 window over exactly the payload, with the next rkey of the window.
	mw, err := c.pd.AllocMW(verbs.MWType2)
	check(err)
	rkey := verbs.IncRkey(mw.RKey())
	check(c.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRBindMW, Flags: verbs.SendSignaled,
		Bind: verbs.MWBind{MW: mw, RKey: rkey, MR: c.mr, Addr: c.mr.Addr(), Length: uint64(n),
			Access: verbs.AccessRemoteRead}}}))
	fmt.Printf("C: %v: window rkey 0x%08x (index %d, key8 0x%02x) over %d bytes at 0x%x\n",
		wait(c.cq), rkey, verbs.KeyIndex(rkey), verbs.Key8(rkey), n, c.mr.Addr())

	// S: READ through the window into its own registered buffer. (In mwrpc the address,
	// length and rkey travel in a SEND that C posts right after the bind.)
	addr := c.mr.Addr()
	check(s.qp.PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, n)}, RemoteAddr: addr, RKey: rkey}}))
	wc := wait(s.cq)
	fmt.Printf("S: %v: %q\n", wc, s.mr.Bytes()[:wc.ByteLen])
	if wc.Status != verbs.WCSuccess || !bytes.Equal(s.mr.Bytes()[:n], payload) {
		log.Fatal("READ did not return the payload")
	}

	// S: revoke the window with SEND_WITH_INV; C's receive reports which rkey it revoked.
	check(s.qp.PostSend([]verbs.SendWR{{WRID: 4, Opcode: verbs.WRSendWithInv, Flags: verbs.SendSignaled,
		InvalidateRKey: rkey}}))
	fmt.Printf("S: %v\n", wait(s.cq))
	wc = wait(c.cq)
	fmt.Printf("C: %v\n", wc)
	if wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != rkey {
		log.Fatal("the receive does not report the invalidation")
	}

	// S: a READ with the revoked rkey is refused by C's NIC engine; both QPs go to ERR.
	check(s.qp.PostSend([]verbs.SendWR{{WRID: 5, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{verbs.SGEFor(s.mr, 0, n)}, RemoteAddr: addr, RKey: rkey}}))
	wc = wait(s.cq)
	fmt.Printf("S: READ after revocation: %v\n", wc)
	if wc.Status != verbs.WCRemAccessErr {
		log.Fatalf("READ after revocation: got %v, want REM_ACCESS_ERR", wc.Status)
	}
	fmt.Printf("QP states: C %v, S %v\n", c.qp.State(), s.qp.State())

	// Copy counting: an in-process transfer is one memcpy from C's registered memory into
	// S's, counted by the receiving device. Nothing went through a socket or a staging buffer.
	for _, x := range []*side{c, s} {
		st := x.dev.Stats()
		fmt.Printf("%s: %d payload bytes copied region to region, %d to sockets, %d from sockets\n",
			x.dev.Name(), st.CopyBytes, st.SocketTxBytes, st.SocketRxBytes)
	}
	if st := s.dev.Stats(); st.CopyBytes != uint64(n) {
		log.Fatalf("S copied %d bytes, want %d (one copy of the payload)", st.CopyBytes, n)
	}

	check(mw.Dealloc())
	c.close()
	s.close()
}

// open opens a device on fab with a PD, a CQ, an RC QP and a 64 KiB registered buffer.
func open(fab *soft.Fabric, name string, access verbs.Access) *side {
	var x side
	var err error
	x.dev, err = fab.Open(name)
	check(err)
	x.pd, err = x.dev.AllocPD()
	check(err)
	x.cq, err = x.dev.CreateCQ(64)
	check(err)
	x.qp, err = x.pd.CreateQP(verbs.QPInitAttr{SendCQ: x.cq, RecvCQ: x.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	check(err)
	x.mem, err = verbs.Map(64<<10, verbs.MapOptions{})
	check(err)
	x.mr, err = x.pd.RegMR(x.mem.Bytes(), access)
	check(err)
	return &x
}

// connect exchanges endpoints over an in-memory pipe and moves both QPs to RTS.
func connect(a, b verbs.QP) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ca, cb := net.Pipe()
	defer ca.Close()
	defer cb.Close()
	errc := make(chan error, 1)
	go func() { _, err := cm.Connect(ctx, ca, a, cm.DefaultParams()); errc <- err }()
	_, err := cm.Connect(ctx, cb, b, cm.DefaultParams())
	check(err)
	check(<-errc)
}

// wait polls cq until one completion arrives.
func wait(cq verbs.CQ) verbs.WorkCompletion {
	var wc [1]verbs.WorkCompletion
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := cq.Poll(wc[:])
		check(err)
		if n == 1 {
			return wc[0]
		}
		time.Sleep(10 * time.Microsecond)
	}
	log.Fatal("no completion within 5s")
	return wc[0]
}

func (x *side) close() {
	check(x.qp.Destroy())
	check(x.mr.Dereg())
	check(x.cq.Destroy())
	check(x.pd.Dealloc())
	check(x.dev.Close())
	check(x.mem.Unmap())
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
