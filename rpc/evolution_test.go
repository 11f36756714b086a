package rpc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/rpc"
)

// Two versions of one service, as docs/evolution.md describes them: v2 added a field
// (with omitempty), renamed a field in Go while keeping its name on the wire (a msgpack
// tag), and added a method. Changing a field's type is the change that is not allowed.
type userV1 struct {
	Name  string
	Email string
}

type userV2 struct {
	Name        string
	MailAddress string `msgpack:"Email"` // renamed in Go; the wire name stays
	Age         int    `msgpack:",omitempty"`
}

type userV2Bad struct {
	Name  int // was a string: not allowed
	Email string
}

// evolutionServer serves method Get of service "evo.Users" echoing a request of type T,
// and, if extra, a method v1 lacks.
func evolutionServer[T any](t *testing.T, extra bool) string {
	t.Helper()
	echo := func(srv any, ctx context.Context, dec func(any) error, _ rpc.UnaryServerInterceptor) (any, error) {
		in := new(T)
		if err := dec(in); err != nil {
			return nil, err
		}
		return in, nil
	}
	sd := rpc.ServiceDesc{ServiceName: "evo.Users", Methods: []rpc.MethodDesc{{MethodName: "Get", Handler: echo}}}
	if extra {
		sd.Methods = append(sd.Methods, rpc.MethodDesc{MethodName: "Count", Handler: echo})
	}
	srv := rpc.NewServer(deviceServerOpts(t)...)
	srv.RegisterService(&sd, struct{}{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func evolutionClient(t *testing.T, addr string) *rpc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	copts := []rpc.DialOption{}
	if withDevices != nil {
		_, copts = withDevices(t)
	}
	c, err := rpc.Dial(ctx, addr, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestEvolution: an old client and a new server (and the reverse) interoperate after the
// allowed changes; a new client's call of a method the old server lacks is Unimplemented;
// a changed field type fails with InvalidArgument naming the decode error.
func TestEvolution(t *testing.T) {
	ctx := context.Background()
	t.Run("old client, new server", func(t *testing.T) {
		c := evolutionClient(t, evolutionServer[userV2](t, true))
		out := new(userV1)
		if err := c.Invoke(ctx, "/evo.Users/Get", &userV1{Name: "ada", Email: "ada@example.com"}, out); err != nil || *out != (userV1{"ada", "ada@example.com"}) {
			t.Fatalf("v1 call of a v2 server: %+v, %v", out, err)
		}
	})
	t.Run("new client, old server", func(t *testing.T) {
		c := evolutionClient(t, evolutionServer[userV1](t, false))
		out := new(userV2)
		if err := c.Invoke(ctx, "/evo.Users/Get", &userV2{Name: "ada", MailAddress: "ada@example.com", Age: 36}, out); err != nil ||
			*out != (userV2{Name: "ada", MailAddress: "ada@example.com"}) { // the old server drops Age
			t.Fatalf("v2 call of a v1 server: %+v, %v", out, err)
		}
		err := c.Invoke(ctx, "/evo.Users/Count", &userV2{}, new(userV2))
		if !errors.Is(err, rpc.ErrUnimplemented) || !strings.Contains(err.Error(), "/evo.Users/Count") {
			t.Fatalf("a method the old server lacks: %v, want Unimplemented naming it", err)
		}
	})
	t.Run("changed field type", func(t *testing.T) {
		c := evolutionClient(t, evolutionServer[userV2Bad](t, false))
		err := c.Invoke(ctx, "/evo.Users/Get", &userV1{Name: "ada"}, new(userV1))
		if !errors.Is(err, rpc.ErrInvalidArgument) || !strings.Contains(err.Error(), "decoding") || !strings.Contains(err.Error(), "userV2Bad") {
			t.Fatalf("a field whose type changed: %v, want InvalidArgument naming the decode and the type", err)
		}
	})
}

// TestRegisterSameServiceName: two services of one name cannot be registered on one
// server; the panic says why and what to do.
func TestRegisterSameServiceName(t *testing.T) {
	srv := rpc.NewServer()
	srv.RegisterService(&rpc.ServiceDesc{ServiceName: "api.Users", Methods: []rpc.MethodDesc{{MethodName: "Get"}}}, struct{}{})
	defer func() {
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, "api.Users") || !strings.Contains(msg, "already registered") || !strings.Contains(msg, "//mwrpc:service") {
			t.Fatalf("registering a second api.Users: %v", r)
		}
	}()
	srv.RegisterService(&rpc.ServiceDesc{ServiceName: "api.Users", Methods: []rpc.MethodDesc{{MethodName: "List"}}}, struct{}{})
}
