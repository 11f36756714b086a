package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/mwrpc/mwrpc/rpc/health/healthpb"
	"github.com/mwrpc/mwrpc/transport"
)

// Client-side health checking (WithHealthCheck): one Watch of the health service
// (package rpc/health) per connection, on that connection, whose last status says
// whether the endpoint takes calls (usable).

// healthWatchMethod is the health service's Watch (rpc/health: grpc.health.v1.Health).
const healthWatchMethod = "/grpc.health.v1.Health/Watch"

// healthState is an endpoint's health as its check last saw it, on one connection.
type healthState struct {
	conn *transport.Conn
	err  error // why the endpoint takes no calls; nil: healthy
}

// errHealthPending: a connection whose first health status has not come yet.
var errHealthPending = errors.New("waiting for the first health status")

// healthyOn says whether the health check found ep healthy on conn.
func (ep *endpoint) healthyOn(conn *transport.Conn) bool {
	h := ep.health.Load()
	return conn != nil && h != nil && h.conn == conn && h.err == nil
}

// healthErr says why ep's current connection takes no calls, with WithHealthCheck; nil
// when it is healthy or down.
func (ep *endpoint) healthErr() error {
	conn := ep.conn.Load()
	if conn == nil {
		return nil
	}
	h := ep.health.Load()
	if h == nil || h.conn != conn {
		return fmt.Errorf("%s: %w", ep.addr, errHealthPending)
	}
	return h.err
}

// setHealth records err (nil: healthy) as ep's health on conn, unless conn is no longer
// ep's connection: a watch that outlived its connection cannot mark the next one.
func (c *Client) setHealth(ep *endpoint, conn *transport.Conn, err error) {
	ep.healthMu.Lock()
	if ep.conn.Load() != conn {
		ep.healthMu.Unlock()
		return
	}
	was := ep.healthyOn(conn)
	ep.health.Store(&healthState{conn: conn, err: err})
	ep.healthMu.Unlock()
	if ep.reconnecting.Swap(false) && err != nil {
		c.signalUp() // calls waiting for the reconnection: it came up unhealthy
	}
	if err == nil && !was {
		c.signalUp() // calls waiting for a connection (WaitForReady), and Dial
		if c.resolver != nil {
			c.settle() // endpoints removed from the answer may wait for this one
		}
	}
}

// unhealthy returns the Unavailable error of a call that found no endpoint to take it
// while some are connected: each connected endpoint's health says why. Nil when the
// health check is off or no endpoint is connected.
func (c *Client) unhealthy() error {
	if !c.opts.healthCheck {
		return nil
	}
	var errs []error
	for _, ep := range *c.eps.Load() {
		if err := ep.healthErr(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	cause := errors.Join(errs...)
	return &Status{Code: Unavailable, cause: cause,
		Message: fmt.Sprintf("mwrpc: no endpoint of %s is healthy (%s)", c.target(), strings.Join(msgs, "; "))}
}

// watchHealth watches the health of the service WithHealthCheck names on conn, ep's
// connection, and records each status (setHealth) until conn fails or goes away, ep is
// removed or the client closes. A watch that fails is opened again with the reconnection
// backoff; meanwhile the endpoint is unhealthy. A server without the health service
// (Unimplemented) is healthy.
func (c *Client) watchHealth(ep *endpoint, conn *transport.Conn) {
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(ep.ctx)
	defer cancel()
	go func() { // the watch ends with its connection; this ends with the watch
		select {
		case <-conn.Done():
		case <-conn.GoingAway(): // its calls must drain: the watch is one
		case <-ctx.Done():
		}
		cancel()
	}()
	service := c.opts.healthService
	what := fmt.Sprintf("service %q", service)
	if service == "" {
		what = "the server"
	}
	req := &healthpb.CheckRequest{Service: service}
	backoff := c.opts.backoffBase
	for retry := false; ; retry = true {
		if retry {
			select {
			case <-time.After(backoff/2 + rand.N(backoff/2+1)):
			case <-ctx.Done():
				return
			}
			backoff = min(2*backoff, c.opts.backoffMax)
		}
		cs, err := c.newStreamOn(ctx, ep, conn, healthWatchMethod, req)
		if err == nil {
			for {
				var resp healthpb.CheckResponse
				if err = cs.RecvMsg(&resp); err != nil {
					break
				}
				backoff = c.opts.backoffBase // it answered: a later failure retries at once-ish
				if resp.Status == healthpb.Serving {
					c.setHealth(ep, conn, nil)
				} else {
					c.setHealth(ep, conn, fmt.Errorf("%s: %s is %v (health check)", ep.addr, what, resp.Status))
				}
			}
			cs.Close()
		}
		if ctx.Err() != nil {
			return
		}
		if CodeOf(err) == Unimplemented {
			c.logger().Warn("mwrpc: the server has no health service; health checking is off for this connection, which counts as healthy",
				slog.String("address", ep.addr), slog.String("service", service), slog.Any("err", err))
			c.setHealth(ep, conn, nil)
			return
		}
		if err == io.EOF {
			err = errors.New("the watch ended")
		}
		c.setHealth(ep, conn, fmt.Errorf("%s: health check of %s failed: %w", ep.addr, what, err))
	}
}

// logger is where the client logs: WithLogger's, else slog's default.
func (c *Client) logger() *slog.Logger {
	if c.opts.logger != nil {
		return c.opts.logger
	}
	return slog.Default()
}
