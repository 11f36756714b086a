// Package probe timestamps chosen points of a call's path (the timeline of
// docs/performance.md, "Two processes: a 64 B and a 64 KiB call step by step").
//
// It is compiled in only with the build tag mwrpcprobe. Without it (every ordinary
// build) Mark and MarkN are empty functions that the compiler inlines away: the probe
// points in transport/, transport/verbs/soft/ and rpc/ cost nothing. With it, each mark
// writes (step, aux, CLOCK_MONOTONIC nanoseconds) into a fixed ring of the process, which
// a driver (benchmarks/cmd/mwrpctimeline) dumps and joins with the other process's ring:
// CLOCK_MONOTONIC is one clock for every process of a machine.
package probe

// Step names a probe point. The numbering is the dump format's: append, never reorder.
type Step uint16

// The probe points. Write, Read and their Done marks are the syscalls on a TCP socket,
// wherever they are made (the soft NIC's link, or the driver's raw TCP ping-pong); aux is
// the byte count asked for (Write, Writev) or returned (ReadDone).
const (
	None Step = iota

	// Syscalls on the socket (soft link, raw TCP).
	Write      // write(2) of small frames (one, or a BATCH), aux bytes
	WriteDone  //
	Writev     // writev(2) of a frame with a large payload, aux payload bytes
	WritevDone //
	Read       // read(2) of a frame's header (and a small payload, or a BATCH)
	ReadDone   // aux bytes returned
	ReadPay    // read(2) of a large payload straight into registered memory
	ReadPayDone

	// The soft NIC (transport/verbs/soft).
	PostSend  // QP.PostSend, aux the first work request's opcode
	TxInline  // the poster transmits itself (transmitInline took the lock)
	KickEng   // a hand-off to the QP's engine goroutine (its wake channel was empty)
	EngWake   // the engine goroutine runs after a kick
	Frame     // the stream reader has a frame's header, aux the frame op
	Delivered // deliver returned (completions pushed), aux the frame op

	// The transport (transport/).
	Call       // Conn.call: a call starts, aux 1 if its request is large
	Bind       // sendLarge: the window is bound, its announcement is about to be sent
	Post       // Conn.send posts a message, aux its kind | 0x100 if it revokes a window
	Posted     // PostSend returned
	Reap       // a stream reader runs the parked poller's reaping (verbs.DirectCQ)
	PollerWake // the poller goroutine wakes, aux 1 completion, 2 kick, 3 timer
	Recv       // onRecv parsed a message, aux its kind | 0x100 if large
	ReadPost   // startRead posts the RDMA READ of a peer's window
	ReadDoneT  // onRead: the READ completed
	Dispatch   // a request goes to the handler pool
	Handler    // a handler-pool goroutine starts the request
	RespWrite  // ResponseWriter.Write
	Deliver    // a response completes its call (the caller is signalled)
	Woken      // the caller runs again with its response
	Release    // Response.Release
	FlushCtrl  // the poller flushes queued control messages and revocations

	// The rpc layer (rpc/).
	CopyIn       // the client copies a large request into registered memory
	CopyInDone   //
	CopyResp     // the server copies the response behind its envelope
	CopyRespDone //
	Clone        // the client clones the response out of registered memory
	CloneDone    //

	// The driver.
	CallBegin // the caller starts a call
	CallEnd   // the caller has the response
	Echo      // the server's handler body

	// Later points (the transport).
	Signalled // the caller's done signal is sent (Deliver to Signalled: the wake-up's cost to the reader)
	ReapDone  // a stream reader's reaping for the parked poller ends

	NumSteps
)

var names = [...]string{
	None: "none",

	Write: "write()", WriteDone: "write() returned", Writev: "writev()", WritevDone: "writev() returned",
	Read: "read() of a frame", ReadDone: "read() returned", ReadPay: "read() of a payload", ReadPayDone: "payload read() returned",

	PostSend: "PostSend", TxInline: "poster transmits inline", KickEng: "kick the NIC engine",
	EngWake: "NIC engine goroutine wakes", Frame: "reader has a frame header", Delivered: "frame delivered (completion queued)",

	Call: "Conn.call", Bind: "window bound", Post: "post message", Posted: "PostSend returned",
	Reap: "reader reaps for the parked poller", PollerWake: "poller goroutine wakes", Recv: "onRecv",
	ReadPost: "post RDMA READ", ReadDoneT: "RDMA READ complete", Dispatch: "dispatch to handler pool",
	Handler: "handler goroutine starts", RespWrite: "ResponseWriter.Write", Deliver: "deliver: signal the caller",
	Woken: "caller wakes", Release: "Response.Release", FlushCtrl: "poller flushes control/revocations",

	CopyIn: "copy request into registered memory", CopyInDone: "request copied",
	CopyResp: "copy response behind envelope", CopyRespDone: "response copied",
	Clone: "clone response", CloneDone: "response cloned",

	CallBegin: "call begins", CallEnd: "call ends", Echo: "echo handler",

	Signalled: "caller signalled", ReapDone: "reaping ends",
}

func (s Step) String() string {
	if int(s) < len(names) && names[s] != "" {
		return names[s]
	}
	return "step?"
}

// Record is one mark: when (CLOCK_MONOTONIC ns), where, and its aux value.
type Record struct {
	T    int64
	Step Step
	Aux  uint32
}
