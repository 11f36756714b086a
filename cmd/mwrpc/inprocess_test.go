package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/reflection"
)

// The in-process service: one method whose message has a field of every kind, echoed
// back with the caller's metadata, and a trailer.

type inner struct {
	N    uint8
	Tags []string
}

type allKinds struct {
	B       bool
	I       int64
	Small   int8
	U       uint32
	F       float32
	S       string
	Bytes   []byte
	When    time.Time
	Inner   *inner
	List    []inner
	ByID    map[int]string
	Renamed string `msgpack:"renamed_field"`
	Skipped string `msgpack:"-"`
	Any     any
	MD      string // set by the server: the caller's "x-test" metadata
}

type echoer interface {
	Echo(ctx context.Context, req *allKinds) (*allKinds, error)
}

type echoServer struct{}

func (echoServer) Echo(ctx context.Context, req *allKinds) (*allKinds, error) {
	if req.S == "fail" {
		return nil, rpc.Errorf(rpc.FailedPrecondition, "asked to fail")
	}
	if req.S == "" && req.I < 0 {
		st, _ := rpc.NewStatus(rpc.InvalidArgument, "negative I").WithDetails(&rpc.BadRequest{
			FieldViolations: []rpc.FieldViolation{{Field: "I", Description: "negative"}}})
		return nil, st
	}
	if md, ok := rpc.FromIncomingContext(ctx); ok && len(md["x-test"]) > 0 {
		req.MD = md["x-test"][0]
	}
	_ = rpc.SetTrailer(ctx, rpc.Pairs("x-trailer", "done"))
	_ = rpc.SetHeader(ctx, rpc.Pairs("x-header", "early"))
	return req, nil
}

var echoDesc = rpc.ServiceDesc{
	ServiceName: "test.Echoer",
	HandlerType: (*echoer)(nil),
	Methods: []rpc.MethodDesc{{MethodName: "Echo", Handler: func(srv any, ctx context.Context, dec func(any) error, _ rpc.UnaryServerInterceptor) (any, error) {
		in := new(allKinds)
		if err := dec(in); err != nil {
			return nil, err
		}
		return srv.(echoer).Echo(ctx, in)
	}}},
}

// serveInProcess serves the echo service and reflection on a loopback port.
func serveInProcess(t *testing.T) string {
	t.Helper()
	srv := rpc.NewServer()
	srv.RegisterService(&echoDesc, echoServer{})
	reflection.Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// mwrpc runs the command in this process, with stdin, and returns its exit status and
// outputs.
func mwrpc(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code = run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCallEveryKind(t *testing.T) {
	leakcheck.Check(t)
	addr := serveInProcess(t)
	req := `{"B":true,"I":-9007199254740993,"Small":-5,"U":4000000000,"F":1.5,"S":"hi","Bytes":"AAEC",` +
		`"When":"2026-11-26T09:00:00.5Z","Inner":{"N":7,"Tags":["a","b"]},"List":[{"N":1},{"N":2,"Tags":null}],` +
		`"ByID":{"3":"three","-1":"minus one"},"renamed_field":"r","Any":{"x":[1,2.5,"s"]}}`
	code, out, errs := mwrpc(t, "", "call", "-v", "-H", "X-Test: from the flag", addr, "test.Echoer/Echo", req)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := `{
  "B": true,
  "I": -9007199254740993,
  "Small": -5,
  "U": 4000000000,
  "F": 1.5,
  "S": "hi",
  "Bytes": "AAEC",
  "When": "2026-11-26T09:00:00.5Z",
  "Inner": {
    "N": 7,
    "Tags": [
      "a",
      "b"
    ]
  },
  "List": [
    {
      "N": 1,
      "Tags": null
    },
    {
      "N": 2,
      "Tags": null
    }
  ],
  "ByID": {
    "-1": "minus one",
    "3": "three"
  },
  "renamed_field": "r",
  "Any": {
    "x": [
      1,
      2.5,
      "s"
    ]
  },
  "MD": "from the flag"
}
`
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(errs, "header:\n  x-header: early\ntrailer:\n  x-trailer: done\n") {
		t.Errorf("-v printed no header and trailer: %q", errs)
	}
}

func TestCallErrors(t *testing.T) {
	leakcheck.Check(t)
	addr := serveInProcess(t)
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"unknown field", []string{"call", addr, "test.Echoer/Echo", `{"Nope":1}`}, 1, `allKinds has no field "Nope" (its fields: B, I, Small,`},
		{"out of range", []string{"call", addr, "test.Echoer/Echo", `{"Small":300}`}, 1, "Small: 300 is not a int8: value out of range"},
		{"fraction for an int", []string{"call", addr, "test.Echoer/Echo", `{"I":1.5}`}, 1, "I: 1.5 is not a int64"},
		{"wrong JSON kind", []string{"call", addr, "test.Echoer/Echo", `{"Inner":{"Tags":"a"}}`}, 1, "Inner.Tags: want an array for []string, got a string"},
		{"bad base64", []string{"call", addr, "test.Echoer/Echo", `{"Bytes":"!!"}`}, 1, "Bytes: []byte is base64"},
		{"bad JSON", []string{"call", addr, "test.Echoer/Echo", `{"S":`}, 1, "reading JSON input"},
		{"two requests", []string{"call", addr, "test.Echoer/Echo", `{} {}`}, 2, "want one JSON request, got 2"},
		{"status", []string{"call", addr, "test.Echoer/Echo", `{"S":"fail"}`}, 1, "code = FailedPrecondition desc = asked to fail"},
		{"status details", []string{"call", addr, "test.Echoer/Echo", `{"I":-1}`}, 1, `detail *rpc.BadRequest: {"FieldViolations":[{"Field":"I","Description":"negative"}]}`},
		{"deadline", []string{"call", "-timeout", "1ns", addr, "test.Echoer/Echo", `{}`}, 1, "DeadlineExceeded"},
		{"unknown method", []string{"call", addr, "test.Echoer/Nope", `{}`}, 1, `service test.Echoer has no method "Nope" (it has Echo)`},
		{"unknown service", []string{"describe", addr, "test.Nope"}, 1, `no service "test.Nope" on this server (it has mwrpc.reflection.v1.Reflection, test.Echoer)`},
		{"not SERVICE/METHOD", []string{"call", addr, "test.Echoer", `{}`}, 2, `"test.Echoer" is not SERVICE/METHOD`},
		{"unknown command", []string{"frob", addr}, 2, `unknown command "frob"`},
		{"bad metadata", []string{"call", "-H", "novalue", addr, "test.Echoer/Echo"}, 2, "want 'key: value'"},
		{"no server", []string{"list", "-connect-timeout", "300ms", "127.0.0.1:1"}, 1, "connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := mwrpc(t, "", tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.says) {
				t.Errorf("exit %d, stderr %q; want exit %d saying %q", code, errs, tc.code, tc.says)
			}
		})
	}
}

func TestListAndDescribeInProcess(t *testing.T) {
	leakcheck.Check(t)
	addr := serveInProcess(t)
	if code, out, errs := mwrpc(t, "", "list", addr); code != 0 || out != "mwrpc.reflection.v1.Reflection\ntest.Echoer\n" {
		t.Errorf("list: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs := mwrpc(t, "", "list", addr, "test.Echoer"); code != 0 || out != "test.Echoer/Echo\n" {
		t.Errorf("list service: exit %d, %q %q", code, out, errs)
	}
	code, out, errs := mwrpc(t, "", "describe", addr, "test.Echoer/Echo")
	for _, want := range []string{
		"test.Echoer/Echo: unary (msgpack)\n  request  *main.allKinds\n  response *main.allKinds\n",
		"\nmain.allKinds struct {\n  B bool\n  I int64\n",
		"  renamed_field string\n  Any interface {}\n  MD string\n}\n",
		"\nmain.inner struct {\n  N uint8\n  Tags []string\n}\n",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("describe: exit %d %s, lacks %q:\n%s", code, errs, want, out)
		}
	}
	if strings.Contains(out, "Skipped") {
		t.Errorf("describe shows a field tagged msgpack:\"-\":\n%s", out)
	}
}
