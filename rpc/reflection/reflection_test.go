package reflection_test

import (
	"context"
	"errors"
	"iter"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/internal/leakcheck"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/health"
	"github.com/mwrpc/mwrpc/rpc/reflection"
)

type Base struct {
	ID   int32
	Name string // hidden by Outer.Name
}

type Node struct {
	Value    float64
	Children []*Node // recursive
}

type custom struct{}

func (custom) EncodeMsgpack(*msgpack.Encoder) error  { return nil }
func (*custom) DecodeMsgpack(*msgpack.Decoder) error { return nil }

type Outer struct {
	Base
	Name    string
	Tagged  uint16 `msgpack:"tag,omitempty"`
	Gone    bool   `msgpack:"-"`
	private int
	When    *time.Time
	Tree    Node
	Pairs   map[string][]byte
	Fixed   [4]byte
	Custom  custom
	Dur     time.Duration
}

type Packed struct {
	_msgpack struct{} `msgpack:",as_array"`
	A, B     int
}

// The fields that do not travel are there to be left out; these lines use them.
var _, _ = Outer{}.private, Packed{}._msgpack

type svc interface {
	Unary(ctx context.Context, req *Outer) (*Packed, error)
	Raw(ctx context.Context, req []byte) ([]byte, error)
	Down(ctx context.Context, req *Packed) iter.Seq2[[]byte, error]
	Both(ctx context.Context, in iter.Seq2[Node, error]) iter.Seq2[*Outer, error]
}

func desc() *rpc.ServiceDesc {
	return &rpc.ServiceDesc{
		ServiceName: "test.Svc",
		HandlerType: (*svc)(nil),
		Methods:     []rpc.MethodDesc{{MethodName: "Unary"}, {MethodName: "Raw", Codec: codec.Raw{}}},
		Streams: []rpc.StreamDesc{{StreamName: "Down", ServerStreams: true},
			{StreamName: "Both", ClientStreams: true, ServerStreams: true}},
	}
}

func TestDescribe(t *testing.T) {
	d := reflection.Describe(rpc.ServiceInfo{Desc: desc(), Codec: codec.Msgpack{}})
	byName := map[string]reflection.MethodDescriptor{}
	for _, m := range d.Methods {
		byName[m.Name] = m
	}
	if got := []string{d.Methods[0].Name, d.Methods[1].Name, d.Methods[2].Name, d.Methods[3].Name}; !reflect.DeepEqual(got, []string{"Both", "Down", "Raw", "Unary"}) {
		t.Errorf("methods %v, want them sorted", got)
	}
	checks := []struct {
		method          string
		cs, ss          bool
		req, resp       string
		codec           string
		rawReq, rawResp bool
	}{
		{"Unary", false, false, "*reflection_test.Outer", "*reflection_test.Packed", "msgpack", false, false},
		{"Raw", false, false, "[]byte", "[]byte", "raw", true, true},
		{"Down", false, true, "*reflection_test.Packed", "[]byte", "msgpack", false, true},
		{"Both", true, true, "reflection_test.Node", "*reflection_test.Outer", "msgpack", false, false},
	}
	for _, c := range checks {
		m := byName[c.method]
		if m.ClientStreams != c.cs || m.ServerStreams != c.ss || m.Request.Go != c.req || m.Response.Go != c.resp ||
			m.Codec != c.codec || m.RawRequest != c.rawReq || m.RawResponse != c.rawResp {
			t.Errorf("%s: %+v, want %+v", c.method, m, c)
		}
	}
	outer := d.Struct("reflection_test.Outer")
	if outer == nil {
		t.Fatalf("no Outer among %+v", d.Structs)
	}
	var names []string
	kinds := map[string]reflection.Type{}
	for _, f := range outer.Fields {
		names = append(names, f.Name)
		kinds[f.Name] = f.Type
	}
	// Base's fields are inlined, as msgpack does; its Name is hidden by Outer's.
	if want := []string{"ID", "Name", "tag", "When", "Tree", "Pairs", "Fixed", "Custom", "Dur"}; !reflect.DeepEqual(names, want) {
		t.Errorf("Outer's fields %v, want %v", names, want)
	}
	for name, want := range map[string]reflection.Kind{"ID": reflection.KindInt, "tag": reflection.KindUint, "When": reflection.KindTime,
		"Tree": reflection.KindStruct, "Pairs": reflection.KindMap, "Fixed": reflection.KindBytes, "Custom": reflection.KindAny, "Dur": reflection.KindInt} {
		if kinds[name].Kind != want {
			t.Errorf("field %s: kind %s, want %s", name, kinds[name].Kind, want)
		}
	}
	if !kinds["When"].Nullable || kinds["ID"].Bits != 32 || kinds["Pairs"].Elem.Kind != reflection.KindBytes {
		t.Errorf("When %+v, ID %+v, Pairs %+v", kinds["When"], kinds["ID"], kinds["Pairs"])
	}
	node := d.Struct("reflection_test.Node")
	if node == nil || node.Fields[1].Type.Elem.Struct != "reflection_test.Node" {
		t.Errorf("the recursive Node: %+v", node)
	}
	if p := d.Struct("reflection_test.Packed"); p == nil || !p.AsArray || len(p.Fields) != 2 {
		t.Errorf("Packed (as_array): %+v", p)
	}
}

func TestService(t *testing.T) {
	leakcheck.Check(t)
	srv := rpc.NewServer()
	health.Register(srv)
	reflection.Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc := reflection.NewReflectionClient(c)
	list, err := rc.ListServices(ctx, &reflection.ListRequest{})
	if err != nil || !reflect.DeepEqual(list.Services, []string{"grpc.health.v1.Health", "mwrpc.reflection.v1.Reflection"}) {
		t.Fatalf("ListServices: %+v, %v", list, err)
	}
	d, err := rc.DescribeService(ctx, &reflection.DescribeRequest{Service: "grpc.health.v1.Health"})
	if err != nil {
		t.Fatal(err)
	}
	watch, err := d.FindMethod("Watch")
	if err != nil || !watch.ServerStreams || watch.ClientStreams || watch.Response.Go != "*healthpb.CheckResponse" {
		t.Errorf("Watch: %+v, %v", watch, err)
	}
	if st := d.Struct("healthpb.CheckResponse"); st == nil || st.Fields[0].Name != "Status" || st.Fields[0].Type.Kind != reflection.KindInt {
		t.Errorf("CheckResponse: %+v", st)
	}
	_, err = rc.DescribeService(ctx, &reflection.DescribeRequest{Service: "nope"})
	if !errors.Is(err, rpc.ErrNotFound) {
		t.Errorf("an unknown service: %v, want NotFound", err)
	}
}
