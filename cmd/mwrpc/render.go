package main

import (
	"fmt"
	"strings"

	"github.com/mwrpc/mwrpc/rpc/reflection"
)

// kind names a method's stream kind.
func kind(m *reflection.MethodDescriptor) string {
	switch {
	case m.ClientStreams && m.ServerStreams:
		return "bidirectional streaming"
	case m.ClientStreams:
		return "client streaming"
	case m.ServerStreams:
		return "server streaming"
	}
	return "unary"
}

// render describes methods of d and the structs they reach, in Go's words:
//
//	kvservice.KV/Get: unary (msgpack)
//	  request  *kvservice.GetRequest
//	  response *kvservice.GetResponse
//
//	kvservice.GetRequest struct {
//	  Key string
//	}
func render(d *reflection.ServiceDescriptor, methods []reflection.MethodDescriptor) string {
	var b strings.Builder
	var structs []string
	seen := map[string]bool{}
	var reach func(t *reflection.Type)
	reach = func(t *reflection.Type) {
		if t == nil {
			return
		}
		if t.Kind == reflection.KindStruct && !seen[t.Struct] {
			seen[t.Struct] = true
			structs = append(structs, t.Struct)
			if st := d.Struct(t.Struct); st != nil {
				for i := range st.Fields {
					reach(&st.Fields[i].Type)
				}
			}
		}
		reach(t.Key)
		reach(t.Elem)
	}
	for i := range methods {
		m := &methods[i]
		codec := m.Codec
		if m.RawRequest || m.RawResponse {
			codec += ", []byte messages raw"
		}
		fmt.Fprintf(&b, "%s/%s: %s (%s)\n", d.Name, m.Name, kind(m), codec)
		fmt.Fprintf(&b, "  request  %s\n  response %s\n", streamOf(m.Request.Go, m.ClientStreams), streamOf(m.Response.Go, m.ServerStreams))
		reach(&m.Request)
		reach(&m.Response)
	}
	for _, name := range structs {
		st := d.Struct(name)
		if st == nil {
			continue
		}
		as := ""
		if st.AsArray {
			as = " // travels as an array"
		}
		fmt.Fprintf(&b, "\n%s struct {%s\n", st.Name, as)
		for _, f := range st.Fields {
			omit := ""
			if f.OmitEmpty {
				omit = " // omitempty"
			}
			fmt.Fprintf(&b, "  %s %s%s\n", f.Name, f.Type.Go, omit)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

func streamOf(t string, stream bool) string {
	if stream {
		return "stream of " + t
	}
	return t
}
