package main

import (
	"bytes"
	"fmt"
	"go/format"
	"go/types"
	"path"
	"sort"
	"strings"
)

// Import paths of the packages the generated code uses.
const (
	contextPath = "context"
	rpcPath     = "github.com/mwrpc/mwrpc/rpc"
	codecPath   = "github.com/mwrpc/mwrpc/codec"
)

// importer names the imports of one generated file. A name is never one the package
// declares (or the generated code declares) at package level, nor a local name of the
// generated code; two packages with the same name get name, name2, name3...
type importer struct {
	self  *types.Package
	taken map[string]bool   // names that are not free
	names map[string]string // import path → name
}

func newImporter(self *types.Package, pkgScope map[string]bool) *importer {
	im := &importer{self: self, taken: make(map[string]bool), names: make(map[string]string)}
	for n := range pkgScope {
		im.taken[n] = true
	}
	for n := range localNames {
		im.taken[n] = true
	}
	return im
}

// name returns the name under which the file imports path (whose package is called
// pkgName), adding the import on first use.
func (im *importer) name(importPath, pkgName string) string {
	if n, ok := im.names[importPath]; ok {
		return n
	}
	n := pkgName
	for i := 2; im.taken[n]; i++ {
		n = fmt.Sprintf("%s%d", pkgName, i)
	}
	im.taken[n] = true
	im.names[importPath] = n
	return n
}

// qualifier is the types.Qualifier of the generated file.
func (im *importer) qualifier(p *types.Package) string {
	if p.Path() == im.self.Path() {
		return ""
	}
	return im.name(p.Path(), p.Name())
}

// typ spells t in the generated file.
func (im *importer) typ(t types.Type) string { return types.TypeString(t, im.qualifier) }

// writeImports writes the import declaration: the standard library first, then the
// rest, each sorted by path; a name is spelled out where it differs from the path's last
// element.
func (im *importer) writeImports(b *bytes.Buffer) {
	var std, other []string
	for p := range im.names {
		if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
			other = append(other, p)
		} else {
			std = append(std, p)
		}
	}
	sort.Strings(std)
	sort.Strings(other)
	b.WriteString("import (\n")
	for i, group := range [][]string{std, other} {
		if i > 0 && len(std) > 0 && len(other) > 0 {
			b.WriteString("\n")
		}
		for _, p := range group {
			if n := im.names[p]; n != path.Base(p) {
				fmt.Fprintf(b, "\t%s %q\n", n, p)
			} else {
				fmt.Fprintf(b, "\t%q\n", p)
			}
		}
	}
	b.WriteString(")\n")
}

// emitFile returns the gofmt'ed generated file for the services of one source file of
// package pkg. buildExpr is the file's //go:build expression ("" for none); taken holds
// the package-level names of the package, generated ones included.
func emitFile(pkg *types.Package, services []*service, buildExpr string, taken map[string]bool) ([]byte, error) {
	im := newImporter(pkg, taken)
	e := &emitter{
		im:      im,
		pkgName: pkg.Name(),
		context: im.name(contextPath, "context"),
		rpc:     im.name(rpcPath, "rpc"),
	}
	// Name the imports up front, in the order of their paths, so that a name does not
	// depend on which method happens to use its package first.
	used := make(map[string]*types.Package)
	collect := func(p *types.Package) string {
		if p.Path() != pkg.Path() {
			used[p.Path()] = p
		}
		return ""
	}
	for _, s := range services {
		for _, m := range s.methods {
			if m.raw() && e.codec == "" {
				e.codec = im.name(codecPath, "codec")
			}
			types.TypeString(m.req.typ, collect)
			types.TypeString(m.resp.typ, collect)
		}
	}
	paths := make([]string, 0, len(used))
	for p := range used {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		im.name(p, used[p].Name())
	}

	var body bytes.Buffer
	e.b = &body
	for _, s := range services {
		e.service(s)
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "%s%s. DO NOT EDIT.\n\n", generatedHeader, version)
	if buildExpr != "" {
		fmt.Fprintf(&b, "//go:build %s\n\n", buildExpr)
	}
	fmt.Fprintf(&b, "package %s\n\n", pkg.Name())
	im.writeImports(&b)
	b.Write(body.Bytes())

	src, err := format.Source(b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("generated code does not parse: %v\n%s", err, b.Bytes())
	}
	return src, nil
}

// emitter writes the code of the services of one file.
type emitter struct {
	b                   *bytes.Buffer
	im                  *importer
	pkgName             string
	context, rpc, codec string // import names
}

func (e *emitter) printf(format string, args ...any) { fmt.Fprintf(e.b, format, args...) }

// service writes the client, the registration function, the service descriptor and the
// method handlers of s.
func (e *emitter) service(s *service) {
	S, full := s.name, s.wire
	e.printf("\n// %sServiceName is the full name of service %s.\n", S, S)
	e.printf("const %sServiceName = %q\n", S, full)

	e.printf("\n// %sClient calls service %s; it implements %s.\n", S, S, S)
	e.printf("type %sClient struct {\ncc %s.Invoker\nopts []%s.CallOption\n}\n", S, e.rpc, e.rpc)
	e.printf("\n// New%sClient returns a client of service %s over cc (an *%s.Client).\n", S, S, e.rpc)
	e.printf("func New%sClient(cc %s.Invoker) *%sClient { return &%sClient{cc: cc} }\n", S, e.rpc, S, S)
	e.printf("\n// %s returns a client whose calls pass opts (%s.WaitForReady, %s.Header,\n", clientOptionsMethod, e.rpc, e.rpc)
	e.printf("// %s.Trailer...) after those of c: c.%s(%s.WaitForReady()).Method(ctx, req).\n", e.rpc, clientOptionsMethod, e.rpc)
	e.printf("func (c *%sClient) %s(opts ...%s.CallOption) *%sClient {\n", S, clientOptionsMethod, e.rpc, S)
	e.printf("cp := *c\ncp.opts = append(c.opts[:len(c.opts):len(c.opts)], opts...)\nreturn &cp\n}\n")
	// A stub older than its interface fails to build here, and the compiler's message
	// names the remedy.
	e.printf("\n// The line below fails to build when %s has methods these stubs lack; the\n// compiler's message then names the remedy.\ntype %s = *%sClient\n", S, staleName(S), S)
	e.printf("\nvar _ %s = %s(nil)\n", S, staleName(S))
	for _, m := range s.methods {
		e.clientMethod(s, m, full)
	}

	e.unimplemented(s)

	e.printf("\n// Register%s registers impl as service %s on s.\n", S, S)
	e.printf("func Register%s(s *%s.Server, impl %s) { s.RegisterService(&%sServiceDesc, impl) }\n", S, e.rpc, S, S)

	e.printf("\n// %sServiceDesc describes service %s.\n", S, S)
	e.printf("var %sServiceDesc = %s.ServiceDesc{\n", S, e.rpc)
	e.printf("ServiceName: %q,\n", full)
	e.printf("HandlerType: (*%s)(nil),\n", S)
	e.printf("Methods: []%s.MethodDesc{\n", e.rpc)
	for _, m := range s.methods {
		if m.streaming() {
			continue
		}
		if m.raw() {
			e.printf("{MethodName: %q, Handler: %s, BytesHandler: %s, Codec: %s.Raw{}},\n", m.name, handlerName(s, m), bytesHandlerName(s, m), e.codec)
		} else {
			e.printf("{MethodName: %q, Handler: %s},\n", m.name, handlerName(s, m))
		}
	}
	e.printf("},\n")
	streams := 0
	for _, m := range s.methods {
		if !m.streaming() {
			continue
		}
		if streams == 0 {
			e.printf("Streams: []%s.StreamDesc{\n", e.rpc)
		}
		streams++
		e.printf("{StreamName: %q, Handler: %s", m.name, handlerName(s, m))
		if m.clientStream {
			e.printf(", ClientStreams: true")
		}
		if m.serverStream {
			e.printf(", ServerStreams: true")
		}
		e.printf("},\n")
	}
	if streams > 0 {
		e.printf("},\n")
	}
	e.printf("}\n")

	for _, m := range s.methods {
		if m.streaming() {
			e.streamHandler(s, m)
			continue
		}
		e.handler(s, m, full)
		if m.raw() {
			e.bytesHandler(s, m)
		}
	}
}

// bytesHandler writes the allocation-free handler of a raw method, which the server calls
// when no interceptor is installed.
func (e *emitter) bytesHandler(s *service, m *method) {
	e.printf("\nfunc %s(srv any, ctx %s.Context, req []byte) ([]byte, error) {\n", bytesHandlerName(s, m), e.context)
	e.printf("return srv.(%s).%s(ctx, req)\n}\n", s.name, m.name)
}

// recvFunc is the rpc function that receives one stream message of p's type.
func (e *emitter) recvFunc(p param) string {
	switch p.kind {
	case kindPointer:
		return e.rpc + ".RecvPtr[" + e.im.typ(p.elem) + "]"
	case kindValue:
		return e.rpc + ".RecvValue[" + e.im.typ(p.typ) + "]"
	}
	return e.rpc + ".RecvBytes"
}

// streamClientMethod writes the client's implementation of a streaming method s.m.
func (e *emitter) streamClientMethod(s *service, m *method, full string) {
	in, out := e.im.typ(m.in), e.im.typ(m.out)
	fullMethod := fmt.Sprintf("%q", "/"+full+"/"+m.name)
	e.printf("\n// %s calls %s.%s, a stream.\n", m.name, s.name, m.name)
	switch {
	case m.clientStream && m.serverStream:
		e.printf("func (c *%sClient) %s(ctx %s.Context, in %s) %s {\n", s.name, m.name, e.context, in, out)
		e.printf("return %s.BidiStreamCall(ctx, c.cc, %s, in, %s, c.opts...)\n}\n", e.rpc, fullMethod, e.recvFunc(m.resp))
	case m.serverStream:
		e.printf("func (c *%sClient) %s(ctx %s.Context, req %s) %s {\n", s.name, m.name, e.context, in, out)
		e.printf("return %s.ServerStreamCall(ctx, c.cc, %s, req, %s, c.opts...)\n}\n", e.rpc, fullMethod, e.recvFunc(m.resp))
	default:
		e.printf("func (c *%sClient) %s(ctx %s.Context, in %s) (%s, error) {\n", s.name, m.name, e.context, in, out)
		switch m.resp.kind {
		case kindPointer:
			e.printf("out := new(%s)\n", e.im.typ(m.resp.elem))
			e.printf("if err := %s.ClientStreamCall(ctx, c.cc, %s, in, out, c.opts...); err != nil {\nreturn nil, err\n}\n", e.rpc, fullMethod)
		case kindValue:
			e.printf("var out %s\n", out)
			e.printf("if err := %s.ClientStreamCall(ctx, c.cc, %s, in, &out, c.opts...); err != nil {\nvar zero %s\nreturn zero, err\n}\n", e.rpc, fullMethod, out)
		case kindBytes:
			e.printf("var out %s\n", out)
			e.printf("if err := %s.ClientStreamCall(ctx, c.cc, %s, in, &out, c.opts...); err != nil {\nreturn nil, err\n}\n", e.rpc, fullMethod)
		}
		e.printf("return out, nil\n}\n")
	}
}

// streamHandler writes the server handler of a streaming method s.m.
func (e *emitter) streamHandler(s *service, m *method) {
	e.printf("\nfunc %s(srv any, stream *%s.ServerStream) (any, error) {\n", handlerName(s, m), e.rpc)
	switch {
	case m.clientStream && m.serverStream:
		e.printf("return nil, %s.SendAll(stream, srv.(%s).%s(stream.Context(), %s.RecvAll(stream, %s)))\n}\n",
			e.rpc, s.name, m.name, e.rpc, e.recvFunc(m.req))
	case m.serverStream:
		var decl, decArg, callArg string
		switch m.req.kind {
		case kindPointer:
			decl, decArg, callArg = "in := new("+e.im.typ(m.req.elem)+")", "in", "in"
		case kindValue:
			decl, decArg, callArg = "in := new("+e.im.typ(m.req.typ)+")", "in", "*in"
		case kindBytes:
			decl, decArg, callArg = "var in "+e.im.typ(m.req.typ), "&in", "in"
		}
		e.printf("%s\n", decl)
		e.printf("if err := stream.Request(%s); err != nil {\nreturn nil, err\n}\n", decArg)
		e.printf("return nil, %s.SendAll(stream, srv.(%s).%s(stream.Context(), %s))\n}\n", e.rpc, s.name, m.name, callArg)
	default:
		e.printf("out, err := srv.(%s).%s(stream.Context(), %s.RecvAll(stream, %s))\n", s.name, m.name, e.rpc, e.recvFunc(m.req))
		e.printf("if err != nil {\nreturn nil, err\n}\nreturn out, nil\n}\n")
	}
}

// clientMethod writes the client's implementation of s.m.
func (e *emitter) clientMethod(s *service, m *method, full string) {
	if m.streaming() {
		e.streamClientMethod(s, m, full)
		return
	}
	T, R := e.im.typ(m.req.typ), e.im.typ(m.resp.typ)
	fullMethod := fmt.Sprintf("%q", "/"+full+"/"+m.name)
	e.printf("\n// %s calls %s.%s.\n", m.name, s.name, m.name)
	e.printf("func (c *%sClient) %s(ctx %s.Context, req %s) (%s, error) {\n", s.name, m.name, e.context, T, R)
	switch m.resp.kind {
	case kindPointer:
		e.printf("out := new(%s)\n", e.im.typ(m.resp.elem))
		e.printf("if err := c.cc.Invoke(ctx, %s, req, out, c.opts...); err != nil {\n", fullMethod)
		e.printf("return nil, err\n}\n")
	case kindValue:
		e.printf("var out %s\n", R)
		e.printf("if err := c.cc.Invoke(ctx, %s, req, &out, c.opts...); err != nil {\n", fullMethod)
		e.printf("var zero %s\nreturn zero, err\n}\n", R)
	case kindBytes:
		if m.raw() { // bytes both ways: the allocation-free path when the invoker has it
			e.printf("if bi, ok := c.cc.(%s.BytesInvoker); ok && len(c.opts) == 0 {\nreturn bi.InvokeBytes(ctx, %s, req)\n}\n", e.rpc, fullMethod)
		}
		e.printf("var out %s\n", R)
		e.printf("if err := c.cc.Invoke(ctx, %s, req, &out, c.opts...); err != nil {\n", fullMethod)
		e.printf("return nil, err\n}\n")
	}
	e.printf("return out, nil\n}\n")
}

// handler writes the server handler of s.m: decode the request, then call the
// implementation directly or through the interceptor.
func (e *emitter) handler(s *service, m *method, full string) {
	var decl, decArg, callArg, adapted string
	switch T := e.im.typ(m.req.typ); m.req.kind {
	case kindPointer:
		elem := e.im.typ(m.req.elem)
		decl, decArg, callArg, adapted = "in := new("+elem+")", "in", "in", "req.(*"+elem+")"
	case kindValue:
		decl, decArg, callArg, adapted = "in := new("+T+")", "in", "*in", "*req.(*"+T+")"
	case kindBytes:
		decl, decArg, callArg, adapted = "var in "+T, "&in", "in", "req.("+T+")"
	}
	e.printf("\nfunc %s(srv any, ctx %s.Context, dec func(any) error, interceptor %s.UnaryServerInterceptor) (any, error) {\n",
		handlerName(s, m), e.context, e.rpc)
	e.printf("%s\n", decl)
	e.printf("if err := dec(%s); err != nil {\nreturn nil, err\n}\n", decArg)
	e.printf("if interceptor == nil {\nreturn srv.(%s).%s(ctx, %s)\n}\n", s.name, m.name, callArg)
	e.printf("info := &%s.UnaryServerInfo{Server: srv, FullMethod: %q}\n", e.rpc, "/"+full+"/"+m.name)
	e.printf("handler := func(ctx %s.Context, req any) (any, error) {\n", e.context)
	e.printf("return srv.(%s).%s(ctx, %s)\n}\n", s.name, m.name, adapted)
	e.printf("return interceptor(ctx, in, info, handler)\n}\n")
}

// unimplemented writes Unimplemented<Service>: every method answering Unimplemented, for
// servers to embed so that they keep building when the interface gains methods.
func (e *emitter) unimplemented(s *service) {
	S := s.name
	e.printf("\n// Unimplemented%s answers Unimplemented for every method of %s. Embed it in a\n", S, S)
	e.printf("// server type so that the type still implements %s when methods are added to the\n", S)
	e.printf("// interface: the new methods answer Unimplemented until the type implements them.\n")
	e.printf("type Unimplemented%s struct{}\n", S)
	for _, m := range s.methods {
		in, out := e.im.typ(m.in), e.im.typ(m.out)
		errExpr := fmt.Sprintf("%s.Errorf(%s.Unimplemented, \"method %s of %s is not implemented\")", e.rpc, e.rpc, m.name, s.wire)
		e.printf("\n// %s answers Unimplemented.\n", m.name)
		if m.serverStream {
			elem := e.im.typ(m.resp.typ)
			e.printf("func (Unimplemented%s) %s(%s.Context, %s) %s {\n", S, m.name, e.context, in, out)
			e.printf("return func(yield func(%s, error) bool) {\nvar zero %s\nyield(zero, %s)\n}\n}\n", elem, elem, errExpr)
			continue
		}
		e.printf("func (Unimplemented%s) %s(%s.Context, %s) (%s, error) {\n", S, m.name, e.context, in, out)
		e.printf("var zero %s\nreturn zero, %s\n}\n", out, errExpr)
	}
}
