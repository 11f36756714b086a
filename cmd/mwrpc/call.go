package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/reflection"
)

// caller is one call of mwrpc call: the method, its schema and where messages go.
type caller struct {
	o      *options
	c      *rpc.Client
	s      schema
	m      *reflection.MethodDescriptor
	full   string // "/kvservice.KV/Get"
	out    io.Writer
	stderr io.Writer
}

// call calls a method with JSON, printing the response (or the stream's messages).
func (o *options) call(ctx context.Context, pos []string, stdin io.Reader, out io.Writer) error {
	if len(pos) < 2 || len(pos) > 3 {
		return fmt.Errorf("%w: call takes ADDR SERVICE/METHOD [JSON | -]", errUsage)
	}
	service, method, err := splitMethod(pos[1])
	if err != nil {
		return err
	}
	c, err := o.dial(ctx, pos[0])
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := o.describeService(ctx, c, service)
	if err != nil {
		return err
	}
	m, err := d.FindMethod(method)
	if err != nil {
		return err
	}
	if m.Codec != (codec.Msgpack{}).Name() && m.Codec != (codec.Raw{}).Name() {
		return fmt.Errorf("%s/%s uses the %s codec; mwrpc speaks msgpack and raw", service, method, m.Codec)
	}
	var in io.Reader = strings.NewReader("{}")
	switch {
	case len(pos) == 3 && pos[2] == "-":
		in = stdin
	case len(pos) == 3:
		in = strings.NewReader(pos[2])
	case m.ClientStreams:
		in = stdin
	}
	cl := &caller{o: o, c: c, s: schema{d}, m: m, full: "/" + d.Name + "/" + m.Name, out: out, stderr: o.flags.Output()}
	ctx, cancel := o.callContext(ctx)
	defer cancel()
	if !m.ClientStreams && !m.ServerStreams {
		return cl.unary(ctx, in)
	}
	return cl.stream(ctx, in)
}

// one reads exactly one JSON value from in.
func one(in io.Reader) (json.RawMessage, error) {
	var vals []json.RawMessage
	if err := jsonValues(in, func(v json.RawMessage) error { vals = append(vals, v); return nil }); err != nil {
		return nil, err
	}
	if len(vals) != 1 {
		return nil, fmt.Errorf("%w: want one JSON request, got %d", errUsage, len(vals))
	}
	return vals[0], nil
}

func (cl *caller) unary(ctx context.Context, in io.Reader) error {
	js, err := one(in)
	if err != nil {
		return err
	}
	req, err := cl.s.encode(cl.m.Request, cl.m.RawRequest, js)
	if err != nil {
		return fmt.Errorf("request of %s: %w", cl.full, err)
	}
	var resp []byte
	var header, trailer rpc.MD
	err = cl.c.Invoke(ctx, cl.full, req, &resp, rpc.Header(&header), rpc.Trailer(&trailer))
	cl.metadata("header", header)
	cl.metadata("trailer", trailer)
	if err != nil {
		return err
	}
	j, err := cl.s.decode(cl.m.Response, cl.m.RawResponse, resp)
	if err != nil {
		return fmt.Errorf("response of %s: %w", cl.full, err)
	}
	var ind bytes.Buffer
	if err := json.Indent(&ind, j, "", "  "); err != nil {
		return err
	}
	ind.WriteByte('\n')
	_, err = cl.out.Write(ind.Bytes())
	return err
}

// stream runs a streaming call: the request (or the caller's messages) from in, the
// server's messages (or its reply) out as JSON lines.
func (cl *caller) stream(ctx context.Context, in io.Reader) error {
	var open []byte // a server-streaming call's request, sent with the open
	if !cl.m.ClientStreams {
		js, err := one(in)
		if err != nil {
			return err
		}
		if open, err = cl.s.encode(cl.m.Request, cl.m.RawRequest, js); err != nil {
			return fmt.Errorf("request of %s: %w", cl.full, err)
		}
	}
	var req any
	if open != nil {
		req = open
	}
	cs, err := cl.c.NewStream(ctx, cl.full, req)
	if err != nil {
		return err
	}
	defer cs.Close()
	sent := make(chan error, 1)
	if cl.m.ClientStreams {
		go func() {
			err := cl.send(cs, in)
			sent <- err // before Close: the receiver's failure comes after it
			if err != nil {
				cs.Close()
			}
		}()
	}
	rerr := cl.receive(cs)
	if h, err := cs.Header(); err == nil {
		cl.metadata("header", h)
	}
	cl.metadata("trailer", cs.Trailer())
	select {
	case serr := <-sent:
		if serr != nil {
			return serr // what made the stream fail, rather than its cancellation
		}
	default: // the server ended the stream; the sender may still wait for input
	}
	return rerr
}

// send sends the JSON values of in as messages, then closes the sending side.
func (cl *caller) send(cs *rpc.ClientStream, in io.Reader) error {
	n := 0
	err := jsonValues(in, func(js json.RawMessage) error {
		n++
		msg, err := cl.s.encode(cl.m.Request, cl.m.RawRequest, js)
		if err != nil {
			return fmt.Errorf("message %d of %s: %w", n, cl.full, err)
		}
		return cs.SendMsg(msg)
	})
	if errors.Is(err, io.EOF) {
		return nil // the server ended the stream: receive says how
	}
	if err != nil {
		return err
	}
	if err := cs.CloseSend(); err != nil && err != io.EOF {
		return err
	}
	return nil
}

// receive prints the server's messages (a client-streaming call's reply) until the end.
func (cl *caller) receive(cs *rpc.ClientStream) error {
	raw := cl.m.RawResponse
	for {
		p, err := cs.RecvBytes()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		j, err := cl.s.decode(cl.m.Response, raw, p)
		if err != nil {
			return fmt.Errorf("message of %s: %w", cl.full, err)
		}
		if _, err := fmt.Fprintf(cl.out, "%s\n", j); err != nil {
			return err
		}
	}
}

// metadata prints the response header or trailer with -v.
func (cl *caller) metadata(what string, md rpc.MD) {
	if !cl.o.verbose || len(md) == 0 {
		return
	}
	fmt.Fprintf(cl.stderr, "%s:\n", what)
	for k, vs := range md {
		for _, v := range vs {
			fmt.Fprintf(cl.stderr, "  %s: %s\n", k, v)
		}
	}
}
