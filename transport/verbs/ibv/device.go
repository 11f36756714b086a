//go:build ibverbs && linux && cgo

package ibv

/*
#cgo LDFLAGS: -libverbs
#include <stdlib.h>
#include "mwibv.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"github.com/mwrpc/mwrpc/transport/verbs"
)

// GIDIndexEnv names the environment variable that overrides the GID index.
const GIDIndexEnv = "MWRPC_IBV_GID_INDEX"

// port is the only physical port the provider uses.
const port = 1

// Device is an opened RDMA device (ibv_context). It implements verbs.Device.
type Device struct {
	name string
	ctx  *C.struct_ibv_context
	attr verbs.DeviceAttr
	rxe  bool // the kernel's Soft-RoCE driver

	// Port 1, as queried at Open.
	lid       uint16
	gid       [16]byte
	gidIndex  int
	ethernet  bool // RoCE: the address vector needs the GRH
	activeMTU int  // bytes

	async *fdWatch // asynchronous events

	mu      sync.Mutex
	closed  bool
	objects int              // live PDs and CQs
	qps     map[uint32]*qp   // by QP number
	mws     map[uint32]*mw   // by key index
	srqs    map[uintptr]*srq // by ibv_srq address, for their asynchronous events
}

// Open opens the RDMA device called name, or the first device when name is empty.
func Open(name string) (*Device, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var found [64]C.char
	var cerr C.int
	ctx := C.mwibv_open(cname, &cerr, &found[0], C.int(len(found)))
	if ctx == nil {
		what := name
		if what == "" {
			what = "(first device)"
		}
		return nil, errnoErr("open device "+what, syscall.Errno(cerr))
	}
	d := &Device{name: C.GoString(&found[0]), ctx: ctx, qps: make(map[uint32]*qp), mws: make(map[uint32]*mw), srqs: make(map[uintptr]*srq)}
	if err := d.init(); err != nil {
		C.ibv_close_device(ctx)
		return nil, err
	}
	w, err := watchFD(int(ctx.async_fd), d.asyncEvent)
	if err != nil {
		C.ibv_close_device(ctx)
		return nil, fmt.Errorf("ibv: %s: watch asynchronous events: %w", d.name, err)
	}
	d.async = w
	return d, nil
}

func (d *Device) init() error {
	var a C.struct_ibv_device_attr
	if rc := C.ibv_query_device(d.ctx, &a); rc != 0 {
		return errnoErr(d.name+": query device", syscall.Errno(rc))
	}
	d.attr = verbs.DeviceAttr{
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxMRSize:       uint64(a.max_mr_size),
		MaxMW:           int(a.max_mw),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		MWType2:         a.device_cap_flags&(C.IBV_DEVICE_MEM_WINDOW_TYPE_2A|C.IBV_DEVICE_MEM_WINDOW_TYPE_2B) != 0,
		MaxSRQ:          int(a.max_srq),
		MaxSRQWR:        int(a.max_srq_wr),
		MaxSRQSGE:       int(a.max_srq_sge),
	}
	d.attr.MaxInlineData = maxInline(d.name, d.ctx)
	d.rxe = isRXE(d.name)

	var p C.struct_mwibv_port
	if rc := C.mwibv_query_port(d.ctx, port, &p); rc != 0 {
		return errnoErr(d.name+": query port 1", syscall.Errno(rc))
	}
	d.lid = uint16(p.lid)
	d.ethernet = p.link_layer == C.IBV_LINK_LAYER_ETHERNET
	d.activeMTU = mtuBytes(int(p.active_mtu))
	idx, err := d.pickGID(int(p.gid_tbl_len))
	if err != nil {
		return err
	}
	var raw [16]C.uint8_t
	var typ C.int
	if rc := C.mwibv_gid(d.ctx, port, C.int(idx), &raw[0], &typ); rc != 0 {
		return errnoErr(fmt.Sprintf("%s: query GID %d", d.name, idx), syscall.Errno(rc))
	}
	for i := range raw {
		d.gid[i] = byte(raw[i])
	}
	d.gidIndex = idx
	return nil
}

// pickGID returns the GID index from the environment, or the first RoCE v2 GID that maps an
// IPv4 address (::ffff:a.b.c.d), else the first RoCE v2 GID, else the first populated one.
func (d *Device) pickGID(n int) (int, error) {
	if s := os.Getenv(GIDIndexEnv); s != "" {
		i, err := strconv.Atoi(s)
		if err != nil || i < 0 || (n > 0 && i >= n) {
			return 0, fmt.Errorf("ibv: %s: %s=%q is not a GID index of port 1 (0..%d): %w", d.name, GIDIndexEnv, s, n-1, verbs.ErrInvalid)
		}
		return i, nil
	}
	if !d.ethernet {
		return 0, nil
	}
	first, firstV2 := -1, -1
	for i := 0; i < n; i++ {
		var raw [16]C.uint8_t
		var typ C.int
		if C.mwibv_gid(d.ctx, port, C.int(i), &raw[0], &typ) != 0 {
			continue
		}
		var g [16]byte
		for j := range raw {
			g[j] = byte(raw[j])
		}
		if g == ([16]byte{}) {
			continue
		}
		if first < 0 {
			first = i
		}
		if typ != 1 {
			continue
		}
		if firstV2 < 0 {
			firstV2 = i
		}
		if g[10] == 0xff && g[11] == 0xff && [10]byte(g[:10]) == ([10]byte{}) {
			return i, nil
		}
	}
	switch {
	case firstV2 >= 0:
		return firstV2, nil
	case first >= 0:
		return first, nil
	}
	return 0, fmt.Errorf("ibv: %s: port 1 has no GID: %w", d.name, verbs.ErrUnsupported)
}

var inlineCache sync.Map // device name -> int

// maxInline finds the largest inline size the device accepts for an RC QP (ibv_device_attr
// does not report it) by creating throw-away QPs, once per device name and process.
func maxInline(name string, ctx *C.struct_ibv_context) int {
	if v, ok := inlineCache.Load(name); ok {
		return v.(int)
	}
	n := 0
	for _, want := range []int{1024, 512, 256, 128, 64} {
		if C.mwibv_probe_inline(ctx, C.int(want)) != 0 {
			n = want
			break
		}
	}
	inlineCache.Store(name, n)
	return n
}

// isRXE reports whether the device is driven by rdma_rxe: its sysfs directory has the
// "parent" attribute (the netdev) that rxe defines, and the name is rxe's by convention.
func isRXE(name string) bool {
	if _, err := os.Stat("/sys/class/infiniband/" + name + "/parent"); err != nil {
		return false
	}
	_, err := os.Stat("/sys/class/infiniband/" + name + "/device")
	return err != nil // a virtual device: no PCI parent
}

func mtuBytes(e int) int {
	if e >= 1 && e <= 5 {
		return 128 << e
	}
	return 1024
}

// Name returns the device name, for example "rxe0".
func (d *Device) Name() string { return d.name }

// Attr reports the device's limits.
func (d *Device) Attr() verbs.DeviceAttr { return d.attr }

// SoftRoCE reports whether the device is the kernel's Soft-RoCE (rdma_rxe), whose
// deviations from the IBTA the package documents and works around.
func (d *Device) SoftRoCE() bool { return d.rxe }

// GIDIndex returns the index of the GID that queue pairs use as their source address.
func (d *Device) GIDIndex() int { return d.gidIndex }

// Close releases the device. It fails with verbs.ErrBusy while PDs, CQs or QPs remain.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("ibv: close device %s: %w", d.name, verbs.ErrClosed)
	}
	if d.objects > 0 || len(d.qps) > 0 {
		n, q := d.objects, len(d.qps)
		d.mu.Unlock()
		return fmt.Errorf("ibv: close device %s: %d PDs/CQs and %d QPs still open: %w", d.name, n, q, verbs.ErrBusy)
	}
	d.closed = true
	d.mu.Unlock()
	d.async.stop()
	if rc, err := C.ibv_close_device(d.ctx); rc != 0 {
		return errnoErr("close device "+d.name, cErr(err))
	}
	return nil
}

func (d *Device) use() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("ibv: device %s: %w", d.name, verbs.ErrClosed)
	}
	d.objects++
	return nil
}

func (d *Device) unuse() {
	d.mu.Lock()
	d.objects--
	d.mu.Unlock()
}

// asyncEvent takes one asynchronous event; it reports whether there may be more. QP errors
// mark the QP so that receives posted to it afterwards are flushed; an SRQ's limit event
// signals its LimitReached.
func (d *Device) asyncEvent() (more bool) {
	var typ C.int
	var qpn C.int64_t
	var sp C.uintptr_t
	rc := C.mwibv_async_event(d.ctx, &typ, &qpn, &sp)
	if rc != 0 {
		return false
	}
	switch typ {
	case C.IBV_EVENT_QP_FATAL:
		if qpn >= 0 {
			d.markError(uint32(qpn), nil)
		}
	case C.IBV_EVENT_QP_REQ_ERR:
		if qpn >= 0 {
			d.markError(uint32(qpn), fmt.Errorf("ibv: qp %d: IBV_EVENT_QP_REQ_ERR (the peer sent a request the responder cannot take): %w", qpn, verbs.ErrPeerProtocol))
		}
	case C.IBV_EVENT_QP_ACCESS_ERR:
		if qpn >= 0 {
			d.markError(uint32(qpn), fmt.Errorf("ibv: qp %d: IBV_EVENT_QP_ACCESS_ERR (the peer named a key, range or right this side does not grant): %w", qpn, verbs.ErrRemoteAccess))
		}
	case C.IBV_EVENT_SRQ_LIMIT_REACHED:
		d.mu.Lock()
		s := d.srqs[uintptr(sp)]
		d.mu.Unlock()
		if s != nil {
			s.limitReached()
		}
	}
	return true
}

// markError notes that the QP has gone to ERR on its own, and why when fault is set.
func (d *Device) markError(qpn uint32, fault error) {
	d.mu.Lock()
	q := d.qps[qpn]
	d.mu.Unlock()
	if q != nil {
		if fault != nil {
			q.fault.CompareAndSwap(nil, &fault)
		}
		q.errored.Store(true)
	}
}

// invalidated notes that a type-2 window was invalidated by a received SEND_WITH_INV.
func (d *Device) invalidated(rkey uint32) {
	d.mu.Lock()
	w := d.mws[verbs.KeyIndex(rkey)]
	d.mu.Unlock()
	if w != nil {
		w.mu.Lock()
		if w.c != nil && uint32(w.c.rkey) == rkey {
			w.boundQP = nil
		}
		w.mu.Unlock()
	}
}

// errnoErr wraps a libibverbs errno in the verbs error it stands for.
func errnoErr(op string, e syscall.Errno) error {
	if e == 0 {
		e = syscall.EIO
	}
	var kind error
	switch e {
	case syscall.EINVAL, syscall.EPERM, syscall.EACCES:
		kind = verbs.ErrInvalid
	case syscall.EBUSY:
		kind = verbs.ErrBusy
	case syscall.ENOMEM, syscall.EAGAIN:
		kind = verbs.ErrNoMemory
	case syscall.EOPNOTSUPP, syscall.ENOSYS, syscall.EPROTONOSUPPORT:
		kind = verbs.ErrUnsupported
	case syscall.ENODEV, syscall.ENXIO:
		return fmt.Errorf("ibv: %s: no such RDMA device (is rdma_rxe loaded and a link added?): %w", op, e)
	default:
		return fmt.Errorf("ibv: %s: %w", op, e)
	}
	return fmt.Errorf("ibv: %s: %w: %w", op, kind, e)
}

// cErr returns the errno a failed libibverbs call that returns NULL or -1 left behind.
func cErr(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}
