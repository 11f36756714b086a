package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Resolver turns a client's target into the addresses ("host:port") the client connects
// to. The client calls Resolve once when it starts, again every resolve interval
// (WithResolveInterval), and sooner, at most once per the minimum interval, when a
// connection fails or a dial does. It keeps a connection to each address of the latest
// answer: addresses that appear get an endpoint, addresses that go away are dropped once
// their calls have finished. An error, or an answer with no address, keeps the addresses
// the client has.
//
// The client calls Resolve from one goroutine at a time, with a context that ends when the
// client closes (or after 30 seconds); Resolve must return soon after it ends.
type Resolver interface {
	Resolve(ctx context.Context) ([]string, error)
}

// DNSLookup is the part of *net.Resolver that DNS name resolution uses: pass a
// *net.Resolver (for one, a Go resolver with its own Dial to reach a given DNS server), or
// a fake of your own in tests, to WithDNSLookup or DNSResolver.
type DNSLookup interface {
	// LookupHost returns the addresses of host (its A and AAAA records).
	LookupHost(ctx context.Context, host string) ([]string, error)
	// LookupSRV returns the SRV records of name, called with service and proto empty.
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// StaticResolver returns a Resolver whose answer is always addrs. A target of
// "static:///a:1,b:2", or a bare "a:1,b:2", is a fixed list without it; StaticResolver is
// for WithResolver and for composing resolvers of one's own.
func StaticResolver(addrs ...string) Resolver { return staticResolver(slices.Clone(addrs)) }

type staticResolver []string

func (s staticResolver) Resolve(context.Context) ([]string, error) { return slices.Clone(s), nil }

// DNSResolver returns a Resolver of name through DNS with lookup (net.DefaultResolver when
// nil). A name "host:port" resolves to the A and AAAA records of host, each with port. A
// name whose first label starts with an underscore and that has no port,
// "_service._proto.domain" (for example "_kv._tcp.example.com"), resolves to the SRV
// records of that name: each record's target host, resolved with its A and AAAA records,
// with the record's port. Every record counts alike: SRV priorities and weights are not
// used (the client's balancer spreads the calls). A host that is an IP address is itself.
func DNSResolver(name string, lookup DNSLookup) (Resolver, error) {
	if lookup == nil {
		lookup = net.DefaultResolver
	}
	r := &dnsResolver{name: name, lookup: lookup}
	if strings.HasPrefix(name, "_") && !strings.Contains(name, ":") {
		r.srv = true
		r.host = strings.TrimSuffix(name, ".")
		if strings.Count(r.host, ".") < 2 || strings.Contains(r.host, "..") {
			return nil, fmt.Errorf("SRV name %q: want _service._proto.domain", name)
		}
		return r, nil
	}
	if err := checkAddress(name); err != nil {
		return nil, fmt.Errorf("%w; or _service._proto.domain for SRV records", err)
	}
	r.host, r.port, _ = net.SplitHostPort(name)
	if r.host == "" {
		return nil, fmt.Errorf("address %q: no host", name)
	}
	return r, nil
}

type dnsResolver struct {
	name       string // as given
	host, port string // host:port, or (srv) the SRV name in host
	srv        bool
	lookup     DNSLookup
}

// Resolve looks the name up again; see DNSResolver.
func (r *dnsResolver) Resolve(ctx context.Context) ([]string, error) {
	if !r.srv {
		ips, err := r.lookup.LookupHost(ctx, r.host)
		if err != nil {
			return nil, err // the client says which target it was resolving
		}
		addrs := make([]string, 0, len(ips))
		for _, ip := range ips {
			addrs = append(addrs, net.JoinHostPort(ip, r.port))
		}
		return addrs, nil
	}
	_, recs, err := r.lookup.LookupSRV(ctx, "", "", r.host)
	if err != nil {
		return nil, fmt.Errorf("resolving the SRV records of %s: %w", r.host, err)
	}
	var addrs []string
	var errs []error
	for _, rec := range recs {
		target := strings.TrimSuffix(rec.Target, ".")
		ips, err := r.lookup.LookupHost(ctx, target)
		if err != nil {
			errs = append(errs, fmt.Errorf("resolving %s (SRV target of %s): %w", target, r.host, err))
			continue
		}
		port := fmt.Sprint(rec.Port)
		for _, ip := range ips {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
	}
	if len(addrs) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return addrs, nil // a target that did not resolve is left out; the others are used
}

// parseTarget reads a client's target: a resolver to run, or (static) the fixed list of
// addresses, and the name telemetry reports as the server's address. Targets:
//
//	host:port[,host:port...]     a fixed list (as ever)
//	static:///host:port[,...]    the same
//	dns:///host:port             A and AAAA records of host
//	dns:///_service._proto.name  SRV records (see DNSResolver)
//	dns://server[:port]/name     the same, asking the DNS server at server (port 53 by default)
//
// WithResolver replaces all of this: the target is then only a name.
func parseTarget(target string, o *dialOptions) (r Resolver, static []string, peer string, err error) {
	if o.resolver != nil {
		return o.resolver, nil, target, nil
	}
	scheme, rest, ok := strings.Cut(target, "://")
	if !ok {
		static, err := parseList(target, target)
		return nil, static, target, err
	}
	authority, name, ok := strings.Cut(rest, "/")
	if !ok { // "dns://kv:7000": kv:7000 would be the DNS server's address, with no name
		return nil, nil, "", fmt.Errorf("target %q names no host: want %s:///host:port", target, scheme)
	}
	switch scheme {
	case "shm": // the same host's shm fabric: shm:///path/to.sock
		if authority != "" || name == "" {
			return nil, nil, "", fmt.Errorf("target %q: want shm:///path/to.sock (an absolute socket path, no host)", target)
		}
		return nil, []string{target}, target, nil
	case "static":
		if authority != "" {
			return nil, nil, "", fmt.Errorf("target %q: a static target has no authority (want static:///host:port,...)", target)
		}
		static, err := parseList(target, name)
		if err != nil {
			return nil, nil, "", err
		}
		return nil, static, name, nil
	case "dns":
		if name == "" {
			return nil, nil, "", fmt.Errorf("target %q names no host: want dns:///host:port or dns:///_service._proto.domain", target)
		}
		lookup := o.dnsLookup
		if authority != "" {
			if lookup, err = dnsServer(authority); err != nil {
				return nil, nil, "", fmt.Errorf("target %q: DNS server: %w", target, err)
			}
		}
		r, err := DNSResolver(name, lookup)
		if err != nil {
			return nil, nil, "", fmt.Errorf("target %q: %w", target, err)
		}
		return r, nil, name, nil
	}
	return nil, nil, "", fmt.Errorf("target %q: unknown scheme %q (want dns, static, shm, or host:port,...)", target, scheme)
}

// parseList reads list, a comma-separated list of host:port, of target.
func parseList(target, list string) ([]string, error) {
	var addrs []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			if err := checkAddress(a); err != nil {
				if list != target {
					err = fmt.Errorf("target %q: %w", target, err)
				}
				return nil, err
			}
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("target %q names no address", target)
	}
	return addrs, nil
}

// dnsServer returns a Go resolver that asks the DNS server at addr (host or host:port; port
// 53 by default) and no other.
func dnsServer(addr string) (*net.Resolver, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]"), "53")
	}
	if err := checkAddress(addr); err != nil {
		return nil, err
	}
	if host, _, _ := net.SplitHostPort(addr); !validHost(host) {
		return nil, fmt.Errorf("address %q: bad host", addr)
	}
	var d net.Dialer
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}, nil
}

// resolveTimeout bounds one call of Resolve.
const resolveTimeout = 30 * time.Second

// resolveLoop runs the client's resolver until the client closes: at once, then every
// resolve interval, and when a failed connection asks for it (reresolve), but not sooner
// than the minimum interval after the last time. Until a first answer with addresses, a
// failure is retried with the reconnection backoff.
func (c *Client) resolveLoop() {
	defer c.wg.Done()
	backoff := c.opts.backoffBase
	for {
		select { // a request made before this resolution is answered by it
		case <-c.resolveNow:
		default:
		}
		last := time.Now()
		ctx, cancel := context.WithTimeout(c.ctx, resolveTimeout)
		addrs, err := c.resolver.Resolve(ctx)
		cancel()
		if c.ctx.Err() != nil {
			return
		}
		c.setAddrs(addrs, err)
		wait := c.opts.resolveInterval
		if len(*c.eps.Load()) == 0 { // nothing to connect to yet
			wait = backoff/2 + rand.N(backoff/2+1)
			backoff = min(2*backoff, c.opts.backoffMax)
		} else {
			backoff = c.opts.backoffBase
		}
		timer := time.NewTimer(wait)
		select {
		case <-c.closed:
			timer.Stop()
			return
		case <-timer.C:
		case <-c.resolveNow:
			timer.Stop()
			if d := c.opts.resolveMin - time.Since(last); d > 0 {
				timer.Reset(d)
				select {
				case <-c.closed:
					timer.Stop()
					return
				case <-timer.C:
				}
			}
		}
	}
}

// reresolve asks the resolver loop, if there is one, to resolve the target again soon.
func (c *Client) reresolve() {
	if c.resolver == nil {
		return
	}
	select {
	case c.resolveNow <- struct{}{}:
	default:
	}
}

// setAddrs applies a resolver's answer: the endpoints follow addrs, less those that cannot
// be dialed. An error, or no address left, keeps the endpoints as they are; either is
// recorded (Dial's and failing calls' errors say it) and logged.
func (c *Client) setAddrs(addrs []string, err error) {
	var bad []error
	if err == nil {
		valid := addrs[:0:0]
		for _, a := range addrs {
			if e := checkAddress(a); e != nil {
				bad = append(bad, e)
			} else if !slices.Contains(valid, a) {
				valid = append(valid, a)
			}
		}
		if len(valid) == 0 {
			err = errors.Join(append([]error{errors.New("no address")}, bad...)...)
		} else {
			c.update(valid)
			err = errors.Join(bad...)
		}
	}
	if err != nil {
		err = fmt.Errorf("resolving %s: %w", c.name, err)
	}
	c.resolveMu.Lock()
	c.resolveErr = err
	c.resolveMu.Unlock()
	if err != nil && c.opts.logger != nil {
		c.opts.logger.Warn("mwrpc: name resolution failed; the client keeps its addresses", slog.String("target", c.name),
			slog.Int("addresses", len(*c.eps.Load())), slog.Any("error", err))
	}
}

// lastResolveErr is the error of the last resolution, nil if it succeeded.
func (c *Client) lastResolveErr() error {
	c.resolveMu.Lock()
	defer c.resolveMu.Unlock()
	return c.resolveErr
}

// update makes the endpoints those of addrs: it keeps the endpoints of addresses that stay,
// starts one for each new address, and retires those of addresses that went (their
// maintainers let their calls finish, then close the connection). While no endpoint of
// addrs is up, those that went and are up stay in the set, leaving, so that calls do not
// fail for want of a connection: the first new connection retires them (settle), and a
// leaving endpoint whose connection fails is not redialed (dropLeaving).
func (c *Client) update(addrs []string) {
	c.epsMu.Lock()
	defer c.epsMu.Unlock()
	prev := append(slices.Clone(c.want), c.leaving...)
	want := make([]*endpoint, 0, len(addrs))
	var started []*endpoint
	up := false
	for _, a := range addrs {
		if i := slices.IndexFunc(prev, func(ep *endpoint) bool { return ep.addr == a }); i >= 0 {
			ep := prev[i]
			ep.leaving.Store(false)
			up = up || c.usable(ep)
			want = append(want, ep)
			continue
		}
		ep := c.newEndpoint(a)
		want = append(want, ep)
		started = append(started, ep)
	}
	var leaving, gone []*endpoint
	for _, ep := range prev {
		switch {
		case slices.Contains(want, ep):
		case !up && c.usable(ep):
			ep.leaving.Store(true)
			leaving = append(leaving, ep)
		default:
			gone = append(gone, ep)
		}
	}
	changed := len(started) > 0 || len(gone) > 0 || len(leaving) != len(c.leaving)
	c.want, c.leaving = want, leaving
	c.publish()
	for _, ep := range gone {
		ep.cancel()
	}
	for _, ep := range started {
		c.wg.Add(1)
		go c.maintain(ep)
	}
	if changed && c.opts.logger != nil {
		c.opts.logger.Info("mwrpc: addresses changed", slog.String("target", c.name), slog.Any("addresses", addrs))
	}
	c.signalUp() // Dial may wait for the first endpoints; retired ones no longer count
}

// publish makes want and leaving the endpoints calls pick from. The caller holds epsMu.
func (c *Client) publish() {
	eps := append(slices.Clone(c.want), c.leaving...)
	c.eps.Store(&eps)
}

// settle retires the leaving endpoints once an endpoint of the last answer is up (and
// healthy, with WithHealthCheck).
func (c *Client) settle() {
	c.epsMu.Lock()
	defer c.epsMu.Unlock()
	if len(c.leaving) == 0 || !slices.ContainsFunc(c.want, c.usable) {
		return
	}
	for _, ep := range c.leaving {
		ep.cancel()
	}
	c.leaving = nil
	c.publish()
}

// dropLeaving removes ep, whose connection is gone, if it is leaving: it is not redialed.
// It reports whether it did.
func (c *Client) dropLeaving(ep *endpoint) bool {
	c.epsMu.Lock()
	defer c.epsMu.Unlock()
	if !ep.leaving.Load() {
		return false // its address came back meanwhile
	}
	c.leaving = slices.DeleteFunc(slices.Clone(c.leaving), func(e *endpoint) bool { return e == ep })
	c.publish()
	ep.cancel()
	return true
}

// newEndpoint returns an endpoint of addr, not yet maintained.
func (c *Client) newEndpoint(addr string) *endpoint {
	ep := &endpoint{addr: addr}
	ep.ctx, ep.cancel = context.WithCancel(c.ctx)
	ep.lanes.init(c.opts.lanes, addr)
	return ep
}

// retire ends a removed endpoint: no new call takes its connection, the calls it has
// finish, then it closes. A closing client closes it at once.
func (c *Client) retire(ep *endpoint) {
	conn := ep.conn.Swap(nil)
	if conn == nil {
		return
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	// outstanding counts the calls between connFor and their end, which connFor counts
	// before it checks the connection is still the endpoint's: once it is swapped out, a
	// call either is counted here or takes another endpoint.
	for (ep.outstanding.Load() > 0 || conn.InFlight() > 0) && conn.Err() == nil {
		select {
		case <-c.closed:
			return // Close closes the transport and so every connection
		case <-tick.C:
		}
	}
	_ = conn.Close()
}

// validHost reports whether host is an IP address or could be a host name.
func validHost(host string) bool {
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return host != "" && strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") == "" &&
		!strings.HasPrefix(host, ".") && !strings.Contains(host, "..")
}
