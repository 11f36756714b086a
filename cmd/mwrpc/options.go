package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/reflection"
	"github.com/mwrpc/mwrpc/transport/credentials"
)

// options are the command's flags.
type options struct {
	flags          *flag.FlagSet
	headers        headerFlag
	timeout        time.Duration
	connectTimeout time.Duration
	tlsCA          string
	tlsCert        string
	tlsKey         string
	tls            bool
	verbose        bool
}

// headerFlag collects -H 'key: value'.
type headerFlag []string

// String lists the metadata given (flag.Value).
func (h *headerFlag) String() string { return strings.Join(*h, ", ") }

// Set adds one 'key: value' (flag.Value); a value without a key is refused.
func (h *headerFlag) Set(v string) error {
	k, _, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("metadata %q: want 'key: value'", v)
	}
	*h = append(*h, v)
	return nil
}

func newOptions(stderr io.Writer) *options {
	o := &options{flags: flag.NewFlagSet("mwrpc", flag.ContinueOnError)}
	f := o.flags
	f.SetOutput(stderr)
	f.Var(&o.headers, "H", "request metadata, 'key: value' (repeatable)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "the call's deadline (0: none)")
	f.DurationVar(&o.connectTimeout, "connect-timeout", 10*time.Second, "how long to wait for a connection")
	f.StringVar(&o.tlsCA, "tls-ca", "", "PEM CA certificate: use TLS, trusting servers signed by it")
	f.StringVar(&o.tlsCert, "tls-cert", "", "PEM client certificate for mutual TLS (with -tls-key)")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key of -tls-cert")
	f.BoolVar(&o.tls, "tls", false, "use TLS with the system's roots")
	f.BoolVar(&o.verbose, "v", false, "print response headers and trailers to standard error")
	return o
}

// dialOptions returns the client's options from the TLS flags.
func (o *options) dialOptions() ([]rpc.DialOption, error) {
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, fmt.Errorf("%w: -tls-cert and -tls-key go together", errUsage)
	}
	if !o.tls && o.tlsCA == "" && o.tlsCert == "" {
		return nil, nil
	}
	cfg := &tls.Config{}
	if o.tlsCert != "" {
		c, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("-tls-cert/-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	if o.tlsCA != "" {
		pool, err := credentials.LoadCertPool(o.tlsCA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return []rpc.DialOption{rpc.WithTransportCredentials(credentials.NewTLS(cfg))}, nil
}

// dial connects to addr, waiting up to -connect-timeout.
func (o *options) dial(ctx context.Context, addr string) (*rpc.Client, error) {
	opts, err := o.dialOptions()
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	return rpc.Dial(dctx, addr, opts...)
}

// callContext bounds a call by -timeout and carries the -H metadata.
func (o *options) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cancel := context.CancelFunc(func() {})
	if o.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
	}
	if len(o.headers) > 0 {
		md := rpc.MD{}
		for _, h := range o.headers {
			k, v, _ := strings.Cut(h, ":")
			k = strings.ToLower(strings.TrimSpace(k))
			md[k] = append(md[k], strings.TrimSpace(v))
		}
		ctx = rpc.NewOutgoingContext(ctx, md)
	}
	return ctx, cancel
}

// describeService asks the server to describe service.
func (o *options) describeService(ctx context.Context, c *rpc.Client, service string) (*reflection.ServiceDescriptor, error) {
	ctx, cancel := o.callContext(ctx)
	defer cancel()
	d, err := reflection.NewReflectionClient(c).DescribeService(ctx, &reflection.DescribeRequest{Service: service})
	return d, noReflection(err)
}

// noReflection explains an Unimplemented answer from a server without reflection.
func noReflection(err error) error {
	if errors.Is(err, rpc.ErrUnimplemented) {
		return fmt.Errorf("the server has no reflection service (register it with reflection.Register(srv), package github.com/mwrpc/mwrpc/rpc/reflection): %w", err)
	}
	return err
}

// list prints the server's services, or one service's methods.
func (o *options) list(ctx context.Context, pos []string, out io.Writer) error {
	if len(pos) < 1 || len(pos) > 2 {
		return fmt.Errorf("%w: list takes ADDR [SERVICE]", errUsage)
	}
	c, err := o.dial(ctx, pos[0])
	if err != nil {
		return err
	}
	defer c.Close()
	if len(pos) == 2 {
		d, err := o.describeService(ctx, c, pos[1])
		if err != nil {
			return err
		}
		for _, m := range d.Methods {
			fmt.Fprintf(out, "%s/%s\n", d.Name, m.Name)
		}
		return nil
	}
	cctx, cancel := o.callContext(ctx)
	defer cancel()
	resp, err := reflection.NewReflectionClient(c).ListServices(cctx, &reflection.ListRequest{})
	if err != nil {
		return noReflection(err)
	}
	for _, s := range resp.Services {
		fmt.Fprintln(out, s)
	}
	return nil
}

// splitMethod splits "Service/Method" (a leading slash allowed).
func splitMethod(s string) (service, method string, err error) {
	service, method, ok := strings.Cut(strings.TrimPrefix(s, "/"), "/")
	if !ok || service == "" || method == "" {
		return "", "", fmt.Errorf("%w: %q is not SERVICE/METHOD", errUsage, s)
	}
	return service, method, nil
}

// describe prints a service's methods or one method, with the fields of their messages.
func (o *options) describe(ctx context.Context, pos []string, out io.Writer) error {
	if len(pos) != 2 {
		return fmt.Errorf("%w: describe takes ADDR SERVICE[/METHOD]", errUsage)
	}
	service, method, _ := strings.Cut(strings.TrimPrefix(pos[1], "/"), "/")
	c, err := o.dial(ctx, pos[0])
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := o.describeService(ctx, c, service)
	if err != nil {
		return err
	}
	methods := d.Methods
	if method != "" {
		m, err := d.FindMethod(method)
		if err != nil {
			return err
		}
		methods = []reflection.MethodDescriptor{*m}
	}
	fmt.Fprint(out, render(d, methods))
	return nil
}
