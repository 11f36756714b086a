package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/loopback"
	"github.com/mwrpc/mwrpc/pool"
	"github.com/mwrpc/mwrpc/transport/internal/wire"
	"github.com/mwrpc/mwrpc/transport/verbs"
	"github.com/mwrpc/mwrpc/transport/verbs/cm"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// The hostile-peer suite: attacks on a server over the soft TCP fabric (what a peer that
// reaches the port can do), from 127.0.0.2, while a good client on 127.0.0.1 keeps
// calling. Each attack must be refused or bounded with a clear error, counted in Stats
// and logged (rate-limited); the good client must see no error; and the server must come
// back to its baseline of connections, handlers, pooled buffers and goroutines. The table
// of outcomes is in docs/security.md.

// checkP99 is set by make test-hostile, which runs the suite alone on the machine: with
// other test binaries running (go test ./..., which runs packages in parallel) or under
// the race detector, the good client's latency measures them, not the attacks. Otherwise
// the ratios are logged.
var checkP99 = os.Getenv("MWRPC_HOSTILE_P99") == "1" && !raceEnabled

// noisyCores: where other processes kept more cores than this busy on average while an
// attack was measured (read from /proc on Linux), a p99 beyond the bound twice in a row is
// logged, not failed: on a shared machine it measures them (a 2-core machine running other
// builds and tests showed 4-20x on attacks as light as one oversize hello).
const noisyCores = 0.5

// hostileConfig is the server's: tight limits, so the suite runs in seconds.
func hostileConfig(logs io.Writer) Config {
	return Config{
		HandshakeTimeout: 500 * time.Millisecond,
		IdleTimeout:      time.Second,
		CreditTimeout:    300 * time.Millisecond,
		MaxConnsPerHost:  16,
		Handlers:         256,
		Logger:           slog.New(slog.NewTextHandler(logs, nil)),
	}
}

// attackerIP is where attacks come from: a loopback address of its own, so that the
// server's per-host limits tell it from the good client.
var attackerIP = net.IPv4(127, 0, 0, 2)

// goodLanes is how many connections the good client holds and takes in turn, as a
// Client's lanes are: each one is a connection to every limit and counter of the server,
// so the attacks meet a good host holding several.
const goodLanes = 3

// hostile is the suite's fixture: newEnv's server (hostileConfig, serving echo on the soft
// TCP fabric) and its client, the good client, which keeps calling while the attacks run;
// the attackers' own devices and transports beside them.
type hostile struct {
	*env             // server, the good client (client) and its first connection (conn)
	lanes    []*Conn // the good client's connections, conn the first
	t        *testing.T
	logMu    sync.Mutex
	logs     bytes.Buffer // the server's log (lockedWriter)
	atk      *soft.Device // raw attackers' device
	atkPD    verbs.PD
	base     baseline
	measured atomic.Int32 // bumped by begin: the good client's latencies start over
	closers  []func()     // the attack's own transports, closed before the server settles
}

// logText is what the server logged so far.
func (h *hostile) logText() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return h.logs.String()
}

// baseline is what the server holds with only the good client connected.
type baseline struct {
	conns, handlers, pooled, goroutines int
}

func (h *hostile) snapshot() baseline {
	st := h.server.Stats()
	pooled := 0
	for _, c := range st.Pool.Classes {
		pooled += c.InUse
	}
	// Less the send slots of the connections: made on first use, they live with their
	// connection, and how many the good one has made depends on how many of its messages
	// were ever unacknowledged at once (more under an attack's load), not on a leak.
	// Less the grants (pushed.go) too: one per connection at most, until used, reclaimed
	// by the lease or torn down with it.
	h.server.mu.Lock()
	for c := range h.server.conns {
		c.mu.Lock()
		for _, s := range c.out.slots {
			if s != nil && s.buf != nil {
				pooled--
			}
		}
		if c.grant.out != 0 {
			pooled--
		}
		c.mu.Unlock()
	}
	h.server.mu.Unlock()
	return baseline{conns: st.Conns, handlers: st.Handlers, pooled: pooled, goroutines: runtime.NumGoroutine()}
}

// settle waits until the server is back to its baseline (goroutines within a few: the
// runtime's own come and go).
func (h *hostile) settle(what string) {
	h.t.Helper()
	var now baseline
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		now = h.snapshot()
		// (handlers is the pool's workers, idle ones included until they expire: running
		// tells whether a handler runs.)
		if now.conns == h.base.conns && now.pooled == h.base.pooled && now.goroutines <= h.base.goroutines+4 && h.server.running.none() {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("after %s the server did not return to its baseline: %+v, baseline %+v", what, now, h.base)
		}
	}
}

func newHostile(t *testing.T) *hostile {
	h := &hostile{t: t}
	h.env = newEnv(t, tcpFabric, echo, hostileConfig(lockedWriter{&h.logMu, &h.logs}), withClient(Config{}))
	h.lanes = []*Conn{h.conn}
	for len(h.lanes) < goodLanes {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := h.client.Dial(ctx, h.addr)
		cancel()
		if err != nil {
			t.Fatalf("the good client's lane %d: %v", len(h.lanes), err)
		}
		h.lanes = append(h.lanes, c)
	}
	// The attacks draw receiver-not-ready NAKs from the server (16 to 41 a run): raw peers
	// SEND without credits, and floods meet the shared receive queue. They are the server's
	// answer to the attackers, not a SEND of its own that found no receive.
	h.allowRNR = true
	h.atk, _ = soft.OpenTCP("attacker")
	var err error
	if h.atkPD, err = h.atk.AllocPD(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before newEnv's: the attackers' queue pairs are gone by now
		for _, err := range []error{h.atkPD.Dealloc(), h.atk.Close()} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	if _, err = h.goodCalls(2000, nil); err != nil { // warm up
		t.Fatal(err)
	}
	// The baseline is taken with no handler running: the last call's handler may still be
	// releasing its response buffer after the caller had the response.
	for deadline := time.Now().Add(5 * time.Second); !h.server.running.none() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	h.base = h.snapshot()
	return h
}

// goodCalls makes 64 B calls on the good client's lanes in turn: n of them, or with n zero
// until stop is closed (and at least 500). It returns their latencies and the first failure.
func (h *hostile) goodCalls(n int, stop <-chan struct{}) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := bytes.Repeat([]byte{'g'}, 64)
	var lat []time.Duration
	gen := h.measured.Load()
	for i := 0; n == 0 || i < n; i++ {
		if g := h.measured.Load(); g != gen { // the attack begins: what came before was setting it up
			gen, lat = g, lat[:0]
		}
		if n == 0 && len(lat) >= 500 {
			select {
			case <-stop:
				return lat, nil
			default:
			}
		}
		conn, err := h.goodConnNow(ctx, i%len(h.lanes))
		if err != nil {
			return lat, err
		}
		t0 := time.Now()
		resp, err := conn.Call(ctx, req)
		if err != nil {
			return lat, fmt.Errorf("the good client's call %d failed: %w", i, err)
		}
		ok := resp.Status() == StatusOK && bytes.Equal(resp.Bytes(), req)
		resp.Release()
		if !ok {
			return lat, fmt.Errorf("the good client's call %d: status %d", i, resp.Status())
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, nil
}

// goodConnNow is the good client's lane i, a new connection once the server sent GOAWAY
// on the old (its idle timeout: the suite's pauses between attacks are longer), as the rpc
// layer does. The old one closes.
func (h *hostile) goodConnNow(ctx context.Context, i int) (*Conn, error) {
	old := h.lanes[i]
	select {
	case <-old.GoingAway():
	default:
		return old, nil
	}
	old.Close()
	c, err := h.client.Dial(ctx, h.addr)
	if err != nil {
		return nil, fmt.Errorf("the good client's lane %d, redialed after GOAWAY: %w", i, err)
	}
	h.lanes[i] = c
	if i == 0 {
		h.conn = c // env's diagnostics read it
	}
	return c, nil
}

// begin marks where an attack's measured part starts, after what it set up (attacker
// transports of its own, in this process, cost CPU a remote attacker would spend on its
// own machine). The garbage of that setup (an attacker transport's receive slots are
// megabytes) is collected first, so that the collection's pauses and assists do not land
// on the good client's measured calls.
func (h *hostile) begin() {
	runtime.GC()
	h.measured.Add(1)
}

func p99(lat []time.Duration) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// attack runs one attack while the good client calls, then checks the good client's p99
// against its p99 alone just before (at most bound times), that the server logged want (a
// substring), and that it returned to its baseline.
//
// The bound is 2 but for connection floods, 4: thousands of TCP handshakes a second on
// loopback are the kernel's work on the same two cores (softirq, on no process's
// account), which no server-side limit can take off the good client; the figures are in
// docs/security.md.
func (h *hostile) attack(name, want string, bound float64, run func()) {
	retry := !strings.HasSuffix(name, " (again)")
	h.t.Run(name, func(t *testing.T) {
		h.t, t = t, h.t
		defer func() { h.t = t }()
		aloneLat, err := h.goodCalls(2000, nil) // alone, just before: the machine as it is now
		if err != nil {
			h.t.Fatal(err)
		}
		h.quiet()
		stop := make(chan struct{})
		type result struct {
			lat []time.Duration
			err error
		}
		res := make(chan result, 1)
		cpu0, cpuOK := sampleCPU()
		go func() {
			lat, err := h.goodCalls(0, stop)
			res <- result{lat, err}
		}()
		// An attack that fails (Fatalf) stops the good client too, so that its calls do not
		// run on into the next attack (racing on its connection, and leaking).
		finished := false
		defer func() {
			if !finished {
				close(stop)
				<-res
			}
		}()
		run()
		finished = true
		close(stop)
		r := <-res
		cpu1, _ := sampleCPU()
		others := othersCores(cpu0, cpu1)
		// The attack's own transports close after the measured part: tearing them down is
		// the attacker's CPU, which a remote attacker spends on its own machine (what their
		// connections leave on the server is checked by settle below).
		for _, f := range h.closers {
			f()
		}
		h.closers = nil
		if r.err != nil {
			h.t.Fatalf("during the attack: %v", r.err)
		}
		lat := r.lat
		alone, under := p99(aloneLat), p99(lat)
		h.t.Logf("%s: good client p99 %v alone, %v during the attack (%.2fx), %d calls; other processes kept %.2f cores busy", name, alone, under, float64(under)/float64(alone), len(lat), others)
		noisy := cpuOK && others > noisyCores
		switch {
		case float64(under) <= bound*float64(alone):
		case !checkP99:
			h.t.Logf("beyond %gx: checked only in make test-hostile (MWRPC_HOSTILE_P99=1), where nothing else runs", bound)
		case retry:
			h.t.Logf("beyond %gx: once more, as a noisy neighbour can do this to one round", bound)
			h.attack(name+" (again)", want, bound, run)
		case noisy:
			h.t.Logf("beyond %gx, NOT CHECKED: other processes kept %.2f cores busy during the attack (more than %g), so the good client's latency measured them, not the attack; the bound holds only on a machine the suite has to itself", bound, others, noisyCores)
		default:
			h.t.Errorf("the good client's p99 went from %v alone to %v during the attack: more than %gx", alone, under, bound)
		}
		if want != "" {
			h.waitLog(want)
		}
		h.settle(name)
	})
}

// quiet starts an attack as if the attacker had been quiet a while: the rate limits of its
// address and of the log lines are full again, so one attack's count does not spill into
// the next one's outcome.
func (h *hostile) quiet() {
	h.server.mu.Lock()
	for _, hs := range h.server.hosts {
		hs.tokens = float64(h.server.cfg.MaxConnsPerHost)
	}
	h.server.mu.Unlock()
	h.server.events.mu.Lock()
	for i := range h.server.events.kinds {
		h.server.events.kinds[i].last = time.Time{}
	}
	h.server.events.mu.Unlock()
}

func (h *hostile) waitLog(want string) {
	h.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(h.logText(), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			h.t.Fatalf("the server logged nothing containing %q; it logged:\n%s", want, h.logText())
		}
	}
}

// waitStat waits until f(server stats) holds.
func (h *hostile) waitStat(what string, f func(Stats) bool) {
	h.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f(h.server.Stats()); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: server stats %+v", what, h.server.Stats())
		}
	}
}

// dial opens a TCP connection to the server from the attacker's address.
func (h *hostile) dial() net.Conn {
	h.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: attackerIP}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", h.addr)
	if err != nil {
		h.t.Fatal(err)
	}
	return nc
}

// attacker is a transport that connects from the attacker's address: a peer that speaks
// the protocol, and misuses it.
func (h *hostile) attacker(cfg Config) *Transport {
	h.t.Helper()
	dev, _ := soft.OpenTCP("atk")
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	tr, err := New(dev, nil, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.closers = append(h.closers, func() { tr.Close(); dev.Close() })
	return tr
}

func (h *hostile) connect(tr *Transport) (*Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return tr.NewConn(ctx, h.dial())
}

// rawPeer is a hostile peer that sets a connection up by hand: its own hello, then a
// queue pair of its own connected over the stream, whose bytes it may also write itself.
type rawPeer struct {
	nc   net.Conn
	cq   verbs.CQ
	qp   verbs.QP
	peer wire.Hello
}

func (h *hostile) rawSetup(hello wire.Hello) *rawPeer {
	h.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// Turned away while this host's other connections are still being set up or torn
		// down (MaxConnsPerHost), or it opens them too fast: the attacker insists.
		if r := h.rawSetupOnce(hello); r != nil {
			return r
		}
		if time.Now().After(deadline) {
			h.t.Fatal("refused for 5s")
		}
	}
}

// rawSetupOnce is rawSetup, or nil if the server turned the connection away.
func (h *hostile) rawSetupOnce(hello wire.Hello) *rawPeer {
	h.t.Helper()
	r, err := rawConnect(h.addr, h.atk, h.atkPD, hello)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// rawConnect sets a connection up by hand from the attacker's address: its own hello,
// then a queue pair of dev's connected over the stream. It returns nil if the server
// turned the connection away.
func rawConnect(addr string, dev *soft.Device, pd verbs.PD, hello wire.Hello) (*rawPeer, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: attackerIP}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	in := make([]byte, wire.HelloLen)
	r := &rawPeer{nc: nc}
	err = cm.Exchange(ctx, nc, "hello", wire.AppendHello(nil, &hello), in)
	if err == nil && wire.RefusalError(in) != nil {
		nc.Close()
		return nil, nil
	}
	if err == nil {
		_, err = wire.ParseHello(in, &r.peer)
	}
	if err == nil {
		r.cq, err = dev.CreateCQ(64)
	}
	if err == nil {
		r.qp, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	}
	if err == nil {
		_, err = cm.Connect(ctx, nc, r.qp, cm.DefaultParams())
	}
	if err != nil {
		nc.Close()
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *rawPeer) close() {
	if r.qp != nil {
		_ = r.qp.Destroy()
	}
	if r.cq != nil {
		_ = r.cq.Destroy()
	}
}

func normalHello() wire.Hello {
	return wire.Hello{Version: wire.Version, SlotSize: DefaultSlotSize, Credits: DefaultCredits, Inline: DefaultEagerThreshold, MaxMessage: DefaultMaxMessage}
}

// sendHeader is a soft TCP frame header for a SEND of n payload bytes (soft/wire.go).
func sendHeader(n uint32) []byte {
	b := make([]byte, 36)
	b[0] = 1 // SEND
	binary.LittleEndian.PutUint32(b[8:], n)
	return b
}

// serverConnFrom returns the server's connection whose peer is the attacker's address.
func (h *hostile) serverConnFrom() *Conn {
	h.server.mu.Lock()
	defer h.server.mu.Unlock()
	for c := range h.server.conns {
		if c.host != nil && c.host.ip == attackerIP.String() {
			return c
		}
	}
	return nil
}

// postRaw posts wr on c's queue pair behind the transport's back (a hostile peer's
// verbs), with a buffer of the attacker transport's pool as its local memory, and waits
// for the connection to fail (the server refuses, and so the attacker's QP breaks).
func postRaw(tr *Transport, c *Conn, wr verbs.SendWR) error {
	return postRawMsg(tr, c, wr, nil)
}

// postRawMsg is postRaw, with hdr (if set) as the message of a SEND_WITH_INV.
func postRawMsg(tr *Transport, c *Conn, wr verbs.SendWR, hdr *wire.Header) error {
	buf, err := tr.pool.TryGet(4096)
	if err != nil {
		return err
	}
	defer buf.Release()  // after the connection is torn down: no transfer touches it then
	wr.WRID = 0x7f << 56 // a kind the poller does not know: it only fails the connection
	wr.Flags = verbs.SendSignaled
	if wr.Opcode == verbs.WRRDMARead || wr.Opcode == verbs.WRRDMAWrite {
		wr.SGL = []verbs.SGE{buf.SGE()}
	}
	if wr.Opcode == verbs.WRSendWithInv && hdr != nil {
		wire.PutHeader(buf.Bytes(), hdr)
		sge := buf.SGE()
		sge.Length = wire.HeaderLen
		wr.SGL = []verbs.SGE{sge}
	}
	if err := c.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return err
	}
	select {
	case <-c.Done():
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("the attacker's connection did not fail after its refused request")
	}
}

// childRoles are the roles other tests start this binary in, by the environment variable
// that names the role (its value is the role's argument); a role returns the exit code.
var childRoles = map[string]func(arg string) int{}

// TestMain runs the churn attacker when the hostile suite starts this binary as one, or
// another test's child role.
func TestMain(m *testing.M) {
	for env, role := range childRoles {
		if arg := os.Getenv(env); arg != "" {
			os.Exit(role(arg))
		}
	}
	if addr := os.Getenv("MWRPC_HOSTILE_CHURN"); addr != "" {
		n, err := churn(addr)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Printf("truncated %d\n", n)
		os.Exit(0)
	}
	os.Exit(leakcheck.Main(m))
}

// churn is the attacker process: 500 times, half a hello and gone, then a connection set
// up by hand and gone halfway through a frame. It reports how many of the latter the
// server set up (the others it refused).
func churn(addr string) (int, error) {
	lowerPriority()
	dev, _ := soft.OpenTCP("churn")
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		return 0, err
	}
	defer pd.Dealloc()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: attackerIP}, Timeout: 5 * time.Second}
	truncated := 0
	for i := 0; i < 500; i++ {
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			return 0, err
		}
		nc.Write(wire.AppendHello(nil, &wire.Hello{Version: wire.Version})[:wire.HelloLen/2])
		nc.Close()
		r, err := rawConnect(addr, dev, pd, normalHello())
		if err != nil {
			return 0, err
		}
		if r != nil { // set up: half a SEND's frame, then gone
			r.nc.Write(append(sendHeader(100), make([]byte, 50)...))
			r.nc.Close()
			r.close()
			truncated++
		}
	}
	return truncated, nil
}

func TestHostilePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("the hostile-peer suite takes about a minute")
	}
	loopback.Require(t, attackerIP.String())
	h := newHostile(t)

	h.attack("garbage hellos", "not an mwrpc peer", 4, func() {
		before := h.server.Stats()
		for i := 0; i < 100; i++ {
			nc := h.dial()
			junk := make([]byte, wire.HelloLen)
			rand.Read(junk)
			nc.Write(junk)
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadAll(nc); err != nil { // the server's hello, then its close
				h.t.Errorf("garbage hello %d: the server did not close the connection: %v", i, err)
			}
			nc.Close()
		}
		// Each failed its setup, or was turned away (the host opens connections too fast).
		h.waitStat("100 garbage hellos", func(s Stats) bool { return s.SetupFailed+s.Refused >= before.SetupFailed+before.Refused+100 })
		// Rate-limited: a burst, then one a second, and a count of what was dropped.
		lines := strings.Count(h.logText(), "connection setup failed")
		if lines >= 100 || lines < 1 {
			h.t.Errorf("%d log lines for 100 failed setups: want at least one and far fewer than 100", lines)
		}
	})

	h.attack("oversize hello", "connection setup failed", 2, func() {
		nc := h.dial()
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		go nc.Write(bytes.Repeat([]byte("MWRT"), 1<<18)) // 1 MiB: the server reads a hello's 24 bytes
		// The server closes over the unread rest: a reset, or an end.
		if _, err := io.ReadAll(nc); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			h.t.Errorf("oversize hello: %v", err)
		}
	})

	h.attack("silent connections", "", 2, func() {
		before := h.server.Stats()
		var conns []net.Conn
		for i := 0; i < 16; i++ {
			conns = append(conns, h.dial())
		}
		for i, nc := range conns { // the server's hello, then its close at HandshakeTimeout
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if b, err := io.ReadAll(nc); err != nil || len(b) != wire.HelloLen {
				h.t.Errorf("silent connection %d: read %d bytes, %v: want the hello, then the server's close", i, len(b), err)
			}
			nc.Close()
		}
		// (Their log lines may be suppressed: the garbage hellos used this kind's burst.)
		h.waitStat("16 silent connections", func(s Stats) bool { return s.SetupFailed+s.Refused >= before.SetupFailed+before.Refused+16 })
	})

	h.attack("2,000 idle connections", "(Config.MaxConnsPerHost)", 4, func() {
		before := h.server.Stats()
		var conns []net.Conn
		defer func() {
			for _, nc := range conns {
				nc.Close()
			}
		}()
		refused, unanswered := 0, 0
		for i := 0; i < 2000; i++ {
			nc := h.dial()
			conns = append(conns, nc)
			// Each reads a refusal, or the server's hello when it was admitted: the first
			// 16, and more as the handshake timeout closes those and the rate allows. On a
			// loaded machine the server's own deadline (HandshakeTimeout for a hello, a second
			// for a refusal) may pass before it wrote: it closes, and the end is counted
			// below with the others.
			in := make([]byte, wire.HelloLen)
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := io.ReadFull(nc, in); errors.Is(err, io.EOF) && n == 0 {
				unanswered++
				continue
			} else if err != nil {
				h.t.Fatalf("connection %d: neither a refusal nor a hello: %v", i, err)
			}
			var hello wire.Hello
			if err := wire.RefusalError(in); errors.Is(err, wire.ErrRefused) {
				refused++
			} else if _, err := wire.ParseHello(in, &hello); err != nil {
				h.t.Fatalf("connection %d: read %q: %v", i, in, err)
			}
		}
		if refused < 1000 {
			h.t.Fatalf("%d of 2,000 idle connections refused, want most (MaxConnsPerHost 16, ConnRatePerHost 100)", refused)
		}
		h.t.Logf("%d of 2,000 refused at once; %d closed before the server wrote; the rest got a hello, then the handshake timeout", refused, unanswered)
		// A new good connection is still taken (another host), and works.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := h.client.Dial(ctx, h.addr)
		if err != nil {
			h.t.Fatalf("a good client's new connection during the attack: %v", err)
		}
		c.Close()
		// Every one ends counted: refused, or admitted and then failed its setup (all are
		// idle, so the handshake timeout ends the admitted ones).
		h.waitStat("2,000 idle connections", func(s Stats) bool {
			return s.Refused >= before.Refused+uint64(refused) && s.Refused+s.SetupFailed >= before.Refused+before.SetupFailed+2000
		})
	})

	h.attack("idle connections holding full setups", "", 2, func() {
		atk := h.attacker(Config{})
		h.begin()
		var conns []*Conn
		for i := 0; i < 16; i++ {
			c, err := h.connect(atk)
			if err != nil {
				h.t.Fatalf("attacker connection %d of the 16 a host may hold: %v", i, err)
			}
			conns = append(conns, c)
		}
		_, err := h.connect(atk)
		if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "from this host") {
			h.t.Fatalf("a 17th connection from one host: %v, want ErrRefused naming the per-host limit", err)
		}
		before := h.server.Stats().IdleClosed
		for i, c := range conns { // GOAWAY at IdleTimeout; closed when they hold on
			select {
			case <-c.GoingAway():
			case <-time.After(5 * time.Second):
				h.t.Fatalf("attacker connection %d: no GOAWAY after the idle timeout", i)
			}
			select {
			case <-c.Done():
			case <-time.After(5 * time.Second):
				h.t.Fatalf("attacker connection %d: still open after GOAWAY and the grace", i)
			}
		}
		h.waitStat("idle connections", func(s Stats) bool { return s.IdleClosed >= before+16 })
	})

	h.attack("hello asking for everything", "", 2, func() {
		greedy := wire.Hello{Version: wire.Version, SlotSize: 1<<32 - 1, Credits: 1 << 16, Inline: 1<<32 - 1 - wire.HeaderLen, MaxMessage: 1<<32 - 1}
		r := h.rawSetup(greedy)
		defer r.close()
		var c *Conn
		for deadline := time.Now().Add(5 * time.Second); c == nil; time.Sleep(time.Millisecond) {
			if c = h.serverConnFrom(); c == nil && time.Now().After(deadline) {
				h.t.Fatal("the server never published the greedy connection")
			}
		}
		cfg := &h.server.cfg
		if c.out.credits != cfg.Credits || c.maxSend != cfg.MaxMessage || c.eager != cfg.EagerThreshold || len(c.out.slots) != cfg.Credits+recvCtrlSlots+4 {
			h.t.Errorf("the server granted credits %d, max send %d, eager %d, %d send slots: want its own %d, %d, %d, %d",
				c.out.credits, c.maxSend, c.eager, len(c.out.slots), cfg.Credits, cfg.MaxMessage, cfg.EagerThreshold, cfg.Credits+recvCtrlSlots+4)
		}
	})

	h.attack("frame length 4 GiB", "malformed frame", 2, func() {
		before := h.server.Stats().Protocol
		r := h.rawSetup(normalHello())
		defer r.close()
		h.begin()
		r.nc.Write(sendHeader(1<<32 - 1))
		h.waitStat("a 4 GiB frame", func(s Stats) bool { return s.Protocol >= before+1 })
	})

	h.attack("truncated frames and connections closed mid-frame, 1,000 times", "(Config.ConnRatePerHost)", 4, func() {
		// A flood of connections spends the attacker's CPU as much as the server's: it
		// runs in a process of its own, at the lowest priority, as if on another machine.
		before := h.server.Stats()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "MWRPC_HOSTILE_CHURN="+h.addr)
		out, err := cmd.CombinedOutput()
		if err != nil {
			h.t.Fatalf("the attacker process: %v\n%s", err, out)
		}
		var truncated int
		if _, err := fmt.Sscanf(string(out), "truncated %d", &truncated); err != nil {
			h.t.Fatalf("the attacker process said %q", out)
		}
		// Each was turned away (the host opens connections too fast) or set up and ended.
		h.waitStat("1,000 truncated connections", func(s Stats) bool {
			return s.Refused+s.SetupFailed+uint64(s.Conns) >= before.Refused+before.SetupFailed+uint64(1000-truncated)
		})
		h.t.Logf("%d of 500 frames were cut off on a connection set up; the rest of the 1,000 were refused", truncated)
	})

	h.attack("request flood that never reads replies", "the peer stopped returning credits", 2, func() {
		before := h.server.Stats()
		// The attacker's connections receive into slots of their own (no shared receives)
		// and keep every response there (testHoldResponses), so a response it never
		// releases holds its slot and returns no credit: a transport copies responses out
		// and returns the credits once they hold half a connection's credits (or half the
		// shared slots), and the server's handlers would no longer wait on any credit.
		atk := h.attacker(Config{SharedReceives: -1})
		atk.testHoldResponses.Store(true)
		// All connections are set up before the flood begins, so that their calls are held
		// at once: set up one by one under load, the first ones stalled and failed
		// (CreditTimeout) before the last ones arrived, and no more than a host's share of
		// the handlers was ever held at once.
		conns := make([]*Conn, 8)
		for i := range conns {
			var err error
			if conns[i], err = h.connect(atk); err != nil {
				h.t.Fatal(err)
			}
		}
		h.begin()
		var wg sync.WaitGroup
		var held sync.Mutex
		var responses []*Response
		start := make(chan struct{})
		for _, c := range conns { // 8 x 64 calls held: more than the 192 of 256 handlers a host may take
			for j := 0; j < 160; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					if resp, err := c.Call(ctx, []byte("never read")); err == nil {
						held.Lock()
						responses = append(responses, resp) // never released: no credit returns
						held.Unlock()
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		h.waitStat("the flood", func(s Stats) bool { return s.Stalled > before.Stalled && s.Crowded > before.Crowded })
		for _, r := range responses {
			r.Release()
		}
	})

	h.attack("READ with a random rkey", "a peer's remote access was refused", 2, func() {
		before := h.server.Stats().Access
		atk := h.attacker(Config{})
		c, err := h.connect(atk)
		if err != nil {
			h.t.Fatal(err)
		}
		var rk [4]byte
		rand.Read(rk[:])
		h.begin()
		if err := postRaw(atk, c, verbs.SendWR{Opcode: verbs.WRRDMARead, RKey: binary.LittleEndian.Uint32(rk[:]) | 1, RemoteAddr: 0x7f0000001000}); err != nil {
			h.t.Fatal(err)
		}
		h.waitStat("a random rkey", func(s Stats) bool { return s.Access >= before+1 })
	})

	h.attack("READ with a stale rkey", "", 2, func() {
		before := h.server.Stats().Access
		atk := h.attacker(Config{})
		atk.writable = false // the response through a window of the server's, not written into the request's
		var seen wire.Header
		hook := func(hd *wire.Header) { seen = *hd }
		atk.testHookLarge.Store(&hook)
		c, err := h.connect(atk)
		if err != nil {
			h.t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.Call(ctx, make([]byte, 128<<10)) // a windowed response (above the TCP fabric's eager threshold), read and revoked
		if err != nil {
			h.t.Fatal(err)
		}
		resp.Release()
		if seen.RKey == 0 {
			h.t.Fatal("the response did not come through a window")
		}
		h.waitStat("the window's revocation", func(s Stats) bool { return s.WindowsExposed == 0 })
		h.begin()
		if err := postRaw(atk, c, verbs.SendWR{Opcode: verbs.WRRDMARead, RKey: seen.RKey, RemoteAddr: seen.Addr}); err != nil {
			h.t.Fatal(err)
		}
		h.waitStat("a stale rkey", func(s Stats) bool { return s.Access >= before+1 })
	})

	for _, op := range []verbs.WROpcode{verbs.WRRDMARead, verbs.WRSendWithInv} {
		h.attack(fmt.Sprintf("%v with another connection's rkey", op), "", 2, func() {
			before := h.server.Stats().Access
			atk := h.attacker(Config{})
			c, err := h.connect(atk)
			if err != nil {
				h.t.Fatal(err)
			}
			// While the victim's response window is bound, the attacker uses its key. The
			// victim is a client of its own, so that its hook holds no other's poller.
			vdev, _ := soft.OpenTCP("victim")
			vtr, err := New(vdev, nil, Config{})
			if err != nil {
				h.t.Fatal(err)
			}
			h.closers = append(h.closers, func() { vtr.Close(); vdev.Close() })
			vtr.writable = false // the response through a window of the server's, not written into the request's
			var once sync.Once
			var postErr error
			hook := func(hd *wire.Header) {
				once.Do(func() {
					postErr = postRaw(atk, c, verbs.SendWR{Opcode: op, RKey: hd.RKey, InvalidateRKey: hd.RKey, RemoteAddr: hd.Addr})
				})
			}
			vtr.testHookLarge.Store(&hook)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			victim, err := vtr.Dial(ctx, h.addr)
			if err != nil {
				h.t.Fatal(err)
			}
			req := bytes.Repeat([]byte{'v'}, 128<<10) // above the TCP fabric's eager threshold: through a window
			h.begin()
			resp, err := victim.Call(ctx, req)
			if err != nil || !bytes.Equal(resp.Bytes(), req) {
				h.t.Fatalf("the victim's own call: %v", err)
			}
			resp.Release()
			if postErr != nil {
				h.t.Fatal(postErr)
			}
			h.waitStat("another connection's rkey", func(s Stats) bool { return s.Access >= before+1 })
		})
	}

	hostileGrants(h)

	st := h.server.Stats()
	t.Logf("server counters after the suite: refused %d, setup failed %d, protocol %d (access %d), stalled %d, crowded %d, overloaded %d, idle closed %d",
		st.Refused, st.SetupFailed, st.Protocol, st.Access, st.Stalled, st.Crowded, st.Overloaded, st.IdleClosed)
}

// hostileGrants are the attacks on written requests (pushed.go): a caller that writes
// outside its grant, lies about a write it never made, or announces more than its grant.
func hostileGrants(h *hostile) {
	const n = 256 << 10 // above the TCP fabric's eager threshold: a grant follows
	granted := func() (*Transport, *Conn, peerGrant) {
		atk := h.attacker(Config{})
		c, err := h.connect(atk)
		if err != nil {
			h.t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.Call(ctx, make([]byte, n))
		if err != nil {
			h.t.Fatal(err)
		}
		resp.Release()
		waitGrant(h.t, c)
		c.mu.Lock()
		defer c.mu.Unlock()
		return atk, c, c.grant.in
	}

	h.attack("WRITE outside its grant", "a peer's remote access was refused", 2, func() {
		before := h.server.Stats().Access
		atk, c, g := granted()
		h.begin()
		// 4 KiB from 100 bytes before the grant's end.
		if err := postRaw(atk, c, verbs.SendWR{Opcode: verbs.WRRDMAWrite, RKey: g.rkey, RemoteAddr: g.addr + uint64(g.n) - 100}); err != nil {
			h.t.Fatal(err)
		}
		h.waitStat("a WRITE past its grant", func(s Stats) bool { return s.Access >= before+1 })
	})

	h.attack("written request it never wrote", "", 2, func() {
		// Another caller's bytes in free buffers of the grant's class: a grant shows none.
		var bufs []*pool.Buf
		for range 32 {
			b, err := h.server.pool.TryGet(n)
			if err != nil {
				h.t.Fatal(err)
			}
			b.SetLen(b.Cap())
			for i := range b.Bytes() {
				b.Bytes()[i] = 0xEE
			}
			bufs = append(bufs, b)
		}
		for _, b := range bufs {
			b.Release()
		}
		atk, c, _ := granted()
		atk.testHookPushUnwritten.Store(true)
		before := atk.Stats().Pushed
		h.begin()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.Call(ctx, bytes.Repeat([]byte{1}, n))
		if err != nil {
			h.t.Fatal(err)
		}
		defer resp.Release()
		if atk.Stats().Pushed != before+1 {
			h.t.Fatal("the request was not announced as written")
		}
		if len(resp.Bytes()) != n {
			h.t.Fatalf("%d bytes back, want %d", len(resp.Bytes()), n)
		}
		if i := slices.IndexFunc(resp.Bytes(), func(b byte) bool { return b != 0 }); i >= 0 {
			h.t.Fatalf("the handler was given 0x%02x at %d: not the zeroed grant", resp.Bytes()[i], i)
		}
	})

	h.attack("written request longer than its grant", "the peer broke the protocol", 2, func() {
		before := h.server.Stats().Protocol
		atk, c, g := granted()
		h.begin()
		hdr := wire.Header{Kind: wire.KindRequest, Flags: wire.FlagPushed | wire.FlagWritable, CallID: 1 << 40, Len: g.n + 1, RKey: 1, Addr: 1}
		if err := postRawMsg(atk, c, verbs.SendWR{Opcode: verbs.WRSendWithInv, InvalidateRKey: g.rkey}, &hdr); err != nil {
			h.t.Fatal(err)
		}
		h.waitStat("a written request past its grant", func(s Stats) bool { return s.Protocol >= before+1 })
		if !strings.Contains(h.logText(), "it wrote a request of") {
			h.t.Errorf("the server's log does not say what the peer did:\n%s", h.logText())
		}
	})
}
