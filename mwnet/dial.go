package mwnet

import (
	"context"
	"fmt"
	"net"

	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// Dial connects to a Listener at target ("host:port" or "shm:///path/to.sock") and opens
// the Conn's stream. The Conn has a transport (and, without WithDevice, a soft NIC) of its
// own, which its Close releases.
func Dial(ctx context.Context, target string, opts ...Option) (*Conn, error) {
	o := collect(opts)
	dev := o.device
	var closeDev func() error
	if dev == nil {
		d, _ := soft.OpenTCP("mwnet-dialer")
		dev, closeDev = d, d.Close
	}
	fail := func(err error) (*Conn, error) {
		if closeDev != nil {
			_ = closeDev()
		}
		return nil, &net.OpError{Op: "dial", Net: network, Addr: Addr(target), Err: err}
	}
	tr, err := transport.New(dev, nil, o.config)
	if err != nil {
		return fail(err)
	}
	tc, err := tr.Dial(ctx, target)
	if err != nil {
		_ = tr.Close()
		return fail(err)
	}
	st, err := tc.OpenStream(ctx, nil)
	if err != nil {
		_ = tc.Close()
		_ = tr.Close()
		return fail(fmt.Errorf("mwnet: open stream: %w", err))
	}
	c := newConn(st, true, Addr(target), tc.Peer())
	c.qp = tc
	c.remote = Addr(target)
	if a := tc.Peer().Addr; a != nil && a.String() != "" {
		c.remote = a
	}
	c.release = func() error {
		_ = tc.Close()
		err := tr.Close()
		if closeDev != nil {
			_ = closeDev()
		}
		return err
	}
	return c, nil
}

// Dialer returns a dial function for grpc.WithContextDialer (and http.Transport's
// DialContext, ignoring the network): each call is a Dial of its address with opts.
func Dialer(opts ...Option) func(ctx context.Context, address string) (net.Conn, error) {
	return func(ctx context.Context, address string) (net.Conn, error) {
		return Dial(ctx, address, opts...)
	}
}
