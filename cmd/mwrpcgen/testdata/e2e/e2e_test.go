// Package e2e runs the code mwrpcgen generates for the golden cases (put in place with
// go test -overlay by TestEndToEnd): every method through the generated client, the
// codecs and the generated handler, with and without a server interceptor.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/rpc"

	"github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports"
	atypes "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/a/types"
	btypes "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/b/types"
	cee "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/c/v2"
	myrpc "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/imports/rpc"
	"github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/loopback"
	"github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/pointer"
	"github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/raw"
	"github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/value"
)

// The generated clients take an rpc.Invoker; *rpc.Client is the one they are made for.
var _ rpc.Invoker = (*rpc.Client)(nil)

// recorder is a server interceptor that records the type of each request it sees.
type recorder struct{ seen map[string]string }

func (r *recorder) intercept(ctx context.Context, req any, info *rpc.UnaryServerInfo, handler rpc.UnaryHandler) (any, error) {
	r.seen[info.FullMethod] = fmt.Sprintf("%T", req)
	return handler(ctx, req)
}

// conns returns invokers that reach impl, served as sd describes, in three ways: a
// loopback without an interceptor, a loopback with one, and a real rpc.Server and
// rpc.Client over TCP with one. When the test ends, it checks that the interceptors saw
// the requests of the methods in want, as the types in want.
func conns(t *testing.T, sd *rpc.ServiceDesc, impl any, want map[string]string) map[string]rpc.Invoker {
	t.Helper()
	plain := new(loopback.Conn)
	plain.RegisterService(sd, impl)

	lrec := &recorder{seen: make(map[string]string)}
	intercepted := &loopback.Conn{Interceptor: lrec.intercept}
	intercepted.RegisterService(sd, impl)

	srec := &recorder{seen: make(map[string]string)}
	srv := rpc.NewServer(rpc.WithUnaryInterceptor(srec.intercept))
	srv.RegisterService(sd, impl)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() {
		client.Close()
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		for name, rec := range map[string]*recorder{"loopback": lrec, "rpc": srec} {
			for m, typ := range want {
				if got := rec.seen[m]; got != typ {
					t.Errorf("%s: the interceptor saw a request of type %q for %s; want %q", name, got, m, typ)
				}
			}
		}
	})
	return map[string]rpc.Invoker{"loopback": plain, "loopback+interceptor": intercepted, "rpc": client}
}

// TestRegister registers each service on an rpc.Server with the generated function
// (which checks that the implementation has the service's type).
func TestRegister(t *testing.T) {
	s := rpc.NewServer()
	pointer.RegisterKV(s, kv{})
	value.RegisterCalc(s, calc{})
	raw.RegisterStore(s, store{})
	imports.RegisterCatalog(s, catalog{})
}

var errBoom = errors.New("boom")

// isBoom reports whether err is errBoom, or its message after a trip over the wire.
func isBoom(err error) bool { return err != nil && strings.Contains(err.Error(), errBoom.Error()) }

type kv struct{}

func (kv) Get(ctx context.Context, req *pointer.GetReq) (*pointer.GetResp, error) {
	if req.Key == "" {
		return nil, errBoom
	}
	return &pointer.GetResp{Value: []byte("v:" + req.Key), Found: true}, nil
}

func (kv) Put(ctx context.Context, req *pointer.PutReq) (*pointer.PutResp, error) {
	return &pointer.PutResp{Created: len(req.Value) > 0}, nil
}

func (kv) Delete(ctx context.Context, req *struct{ Key string }) (*struct{}, error) {
	return &struct{}{}, nil
}

func (kv) Scan(ctx context.Context, req pointer.ScanReqPtr) (*pointer.ScanResp, error) {
	return &pointer.ScanResp{Keys: []string{req.Prefix + "1", req.Prefix + "2"}[:req.Limit]}, nil
}

func TestPointer(t *testing.T) {
	for name, conn := range conns(t, &pointer.KVServiceDesc, kv{},
		map[string]string{"/pointer.KV/Get": "*pointer.GetReq", "/pointer.KV/Scan": "*pointer.ScanReq"}) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var cl pointer.KV = pointer.NewKVClient(conn)
			got, err := cl.Get(ctx, &pointer.GetReq{Key: "a"})
			if err != nil || string(got.Value) != "v:a" || !got.Found {
				t.Errorf("Get = %+v, %v", got, err)
			}
			if got, err := cl.Get(ctx, &pointer.GetReq{}); got != nil || !isBoom(err) {
				t.Errorf("Get = %+v, %v; want nil, %v", got, err, errBoom)
			}
			if got, err := cl.Put(ctx, &pointer.PutReq{Key: "k", Value: []byte{1}}); err != nil || !got.Created {
				t.Errorf("Put = %+v, %v", got, err)
			}
			if got, err := cl.Delete(ctx, &struct{ Key string }{"k"}); err != nil || got == nil {
				t.Errorf("Delete = %+v, %v", got, err)
			}
			if got, err := cl.Scan(ctx, &pointer.ScanReq{Prefix: "p", Limit: 2}); err != nil || !reflect.DeepEqual(got.Keys, []string{"p1", "p2"}) {
				t.Errorf("Scan = %+v, %v", got, err)
			}
		})
	}
}

type calc struct{}

func (calc) Add(ctx context.Context, req value.Pair) (int64, error) {
	if req.A < 0 {
		return 99, errBoom
	}
	return req.A + req.B, nil
}
func (calc) Swap(ctx context.Context, req value.Pair) (value.Pair, error) {
	return value.Pair{A: req.B, B: req.A}, nil
}
func (calc) Upper(ctx context.Context, s string) (string, error)  { return strings.ToUpper(s), nil }
func (calc) Half(ctx context.Context, x float64) (float32, error) { return float32(x / 2), nil }
func (calc) Valid(ctx context.Context, id value.ID) (bool, error) { return id == 7, nil }
func (calc) Level(ctx context.Context, name value.Name) (value.Level, error) {
	return value.Level(len(name)), nil
}
func (calc) Nothing(ctx context.Context, req struct{}) (struct{}, error) { return struct{}{}, nil }

func TestValue(t *testing.T) {
	for name, conn := range conns(t, &value.CalcServiceDesc, calc{},
		map[string]string{"/value.Calc/Add": "*value.Pair", "/value.Calc/Upper": "*string", "/value.Calc/Valid": "*value.ID"}) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var cl value.Calc = value.NewCalcClient(conn)
			if got, err := cl.Add(ctx, value.Pair{A: 2, B: 3}); got != 5 || err != nil {
				t.Errorf("Add = %v, %v", got, err)
			}
			if got, err := cl.Add(ctx, value.Pair{A: -1}); got != 0 || !isBoom(err) {
				t.Errorf("Add = %v, %v; want 0, %v", got, err, errBoom)
			}
			if got, err := cl.Swap(ctx, value.Pair{A: 1, B: 2}); got != (value.Pair{A: 2, B: 1}) || err != nil {
				t.Errorf("Swap = %v, %v", got, err)
			}
			if got, err := cl.Upper(ctx, "abc"); got != "ABC" || err != nil {
				t.Errorf("Upper = %q, %v", got, err)
			}
			if got, err := cl.Half(ctx, 3); got != 1.5 || err != nil {
				t.Errorf("Half = %v, %v", got, err)
			}
			if got, err := cl.Valid(ctx, 7); !got || err != nil {
				t.Errorf("Valid = %v, %v", got, err)
			}
			if got, err := cl.Level(ctx, "four"); got != 4 || err != nil {
				t.Errorf("Level = %v, %v", got, err)
			}
			if _, err := cl.Nothing(ctx, struct{}{}); err != nil {
				t.Errorf("Nothing: %v", err)
			}
		})
	}
}

type store struct{}

func (store) Put(ctx context.Context, data []byte) ([]byte, error) {
	return append([]byte("put:"), data...), nil
}
func (store) Echo(ctx context.Context, data []uint8) ([]uint8, error) { return bytes.Clone(data), nil }
func (store) Copy(ctx context.Context, b raw.Bytes) (raw.Bytes, error) {
	if len(b) == 0 {
		return nil, errBoom
	}
	return bytes.Clone(b), nil
}
func (store) Get(ctx context.Context, key string) ([]byte, error) { return []byte(key), nil }
func (store) Stat(ctx context.Context, data []byte) (*raw.Info, error) {
	return &raw.Info{Size: len(data)}, nil
}

func TestRaw(t *testing.T) {
	wantCodec := map[string]codec.Codec{"Put": codec.Raw{}, "Echo": codec.Raw{}, "Copy": codec.Raw{}, "Get": nil, "Stat": nil}
	for _, m := range raw.StoreServiceDesc.Methods {
		if want, ok := wantCodec[m.MethodName]; !ok || m.Codec != want {
			t.Errorf("the codec of Store.%s is %v; want %v", m.MethodName, m.Codec, want)
		}
	}
	for name, conn := range conns(t, &raw.StoreServiceDesc, store{},
		map[string]string{"/raw.Store/Put": "[]uint8", "/raw.Store/Get": "*string", "/raw.Store/Stat": "[]uint8"}) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var cl raw.Store = raw.NewStoreClient(conn)
			if got, err := cl.Put(ctx, []byte("x")); string(got) != "put:x" || err != nil {
				t.Errorf("Put = %q, %v", got, err)
			}
			if got, err := cl.Echo(ctx, []byte{1, 2}); !bytes.Equal(got, []byte{1, 2}) || err != nil {
				t.Errorf("Echo = %v, %v", got, err)
			}
			if got, err := cl.Copy(ctx, nil); got != nil || !isBoom(err) {
				t.Errorf("Copy = %v, %v; want nil, %v", got, err, errBoom)
			}
			if got, err := cl.Get(ctx, "k"); string(got) != "k" || err != nil {
				t.Errorf("Get = %q, %v", got, err)
			}
			if got, err := cl.Stat(ctx, []byte("abc")); err != nil || got.Size != 3 {
				t.Errorf("Stat = %+v, %v", got, err)
			}
		})
	}
}

type catalog struct{}

func (catalog) Ping(ctx context.Context, req *atypes.Ping) (*atypes.Pong, error) {
	return &atypes.Pong{Seq: req.Seq + 1}, nil
}
func (catalog) List(ctx context.Context, f *btypes.Filter) (*atypes.Page[btypes.Item], error) {
	return &atypes.Page[btypes.Item]{Items: []btypes.Item{{ID: len(f.Prefix)}}, Next: f.Prefix}, nil
}
func (catalog) Lookup(ctx context.Context, code cee.Code) (atypes.Item, error) {
	return atypes.Item{Name: fmt.Sprint(code)}, nil
}
func (catalog) Call(ctx context.Context, req *myrpc.Req) (*myrpc.Req, error) {
	return &myrpc.Req{Method: req.Method + "!"}, nil
}

func TestImports(t *testing.T) {
	for name, conn := range conns(t, &imports.CatalogServiceDesc, catalog{},
		map[string]string{"/imports.Catalog/Ping": "*types.Ping", "/imports.Catalog/Lookup": "*cee.Code"}) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var cl imports.Catalog = imports.NewCatalogClient(conn)
			if got, err := cl.Ping(ctx, &atypes.Ping{Seq: 1}); err != nil || got.Seq != 2 {
				t.Errorf("Ping = %+v, %v", got, err)
			}
			if got, err := cl.List(ctx, &btypes.Filter{Prefix: "ab"}); err != nil || got.Next != "ab" || len(got.Items) != 1 || got.Items[0].ID != 2 {
				t.Errorf("List = %+v, %v", got, err)
			}
			if got, err := cl.Lookup(ctx, 42); err != nil || got.Name != "42" {
				t.Errorf("Lookup = %+v, %v", got, err)
			}
			if got, err := cl.Call(ctx, &myrpc.Req{Method: "m"}); err != nil || got.Method != "m!" {
				t.Errorf("Call = %+v, %v", got, err)
			}
		})
	}
}
