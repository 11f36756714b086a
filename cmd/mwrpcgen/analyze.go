package main

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/tools/go/packages"
)

// serviceMarker is the doc comment line that marks an interface as a service when no
// -type is given.
const serviceMarker = "//mwrpc:service"

// allowedTypes is what a request or response may be, for error messages.
const allowedTypes = "use a pointer to a struct, a struct, []byte or a basic type"

// kind is how a request or response travels through the generated code.
type kind int

const (
	kindPointer kind = iota // *S with S a struct: decoded into new(S), passed as is
	kindValue               // a struct or basic type: decoded into new(T), passed as *in
	kindBytes               // []byte: decoded into a []byte (by the raw codec, without a copy)
)

// param is a method's request or response type.
type param struct {
	typ  types.Type // as the interface spells it (an alias stays an alias)
	kind kind
	elem types.Type // kindPointer: the struct type pointed to
}

// method is one method of a service. A stream's param is its element type; in and out
// are the parameter and result types as the interface spells them.
type method struct {
	name                       string
	req, resp                  param
	clientStream, serverStream bool
	in, out                    types.Type
}

// streaming reports whether the method is a streaming one.
func (m *method) streaming() bool { return m.clientStream || m.serverStream }

// raw reports whether the method uses the raw codec: both its request and its response
// are []byte.
func (m *method) raw() bool {
	return !m.streaming() && m.req.kind == kindBytes && m.resp.kind == kindBytes
}

// service is one service interface and its methods.
type service struct {
	name    string // the interface's name
	wire    string // the name calls carry: <package>.<Interface>, or the marker's
	obj     *types.TypeName
	spec    *ast.TypeSpec
	file    string // absolute path of the file that declares it
	pos     token.Position
	methods []*method // sorted by name
}

// generatedNames returns the package-level names the generated code declares for s.
func (s *service) generatedNames() []string {
	names := []string{
		s.name + "ServiceName",
		s.name + "Client",
		"New" + s.name + "Client",
		"Register" + s.name,
		s.name + "ServiceDesc",
		staleName(s.name),
	}
	for _, m := range s.methods {
		names = append(names, handlerName(s, m))
		if m.raw() {
			names = append(names, bytesHandlerName(s, m))
		}
	}
	return names
}

// handlerName is the name of the generated server handler of s.m.
// staleName is the alias the stale-stub check is spelled with: the compiler's error
// quotes it.
func staleName(service string) string { return "_" + service + "_stubs_are_stale_run_go_generate" }

func handlerName(s *service, m *method) string { return "_" + s.name + "_" + m.name + "_Handler" }

// bytesHandlerName is the name of the allocation-free handler of a raw method.
func bytesHandlerName(s *service, m *method) string {
	return "_" + s.name + "_" + m.name + "_BytesHandler"
}

// localNames are the identifiers the generated code declares inside its functions (and
// the predeclared ones it uses): an import must not be named like one of them, and a type
// of the service's own package, which the generated code names unqualified, must not be
// either.
var localNames = map[string]bool{
	"c": true, "cc": true, "ctx": true, "req": true, "out": true, "err": true, "zero": true,
	"srv": true, "dec": true, "interceptor": true, "in": true, "info": true, "handler": true,
	"s": true, "impl": true, "any": true, "error": true, "new": true, "nil": true,
	"stream": true, "opts": true, "yield": true, "cp": true,
}

// clientOptionsMethod is the generated client's method that returns a client whose calls
// pass call options; a service method cannot have its name.
const clientOptionsMethod = "WithCallOptions"

// pkgResult is what generation makes of one package.
type pkgResult struct {
	pkg        *packages.Package
	files      []genFile // the outputs, sorted by path
	stale      []string  // earlier outputs that now hold no service, to delete
	diags      []diag
	warnings   []diag
	found      map[string]bool // the -type names the package declares
	services   int
	loadFailed bool // the package could not be analyzed at all
}

// genFile is one output file.
type genFile struct {
	path     string // absolute
	services []string
	src      []byte
}

// analyzer finds and checks the services of one package.
type analyzer struct {
	pkg       *packages.Package
	fset      *token.FileSet
	self      *types.Package
	specs     map[*types.TypeName]*ast.TypeSpec
	marked    map[*types.TypeName]bool
	wireNames map[*types.TypeName]string // the names //mwrpc:service lines give
	files     map[string]*ast.File       // by absolute file name
	diags     []diag
	warnings  []diag // what does not stop generation but the user should know
	invalid   bool   // a service's declaration involves an invalid type (a type error)
	services  []*service
}

// analyzePackage finds the services of pkg (those named in types, or those marked with
// //mwrpc:service when types is empty), checks them and generates their files. It
// writes nothing.
func analyzePackage(ld *loader, pkg *packages.Package, names []string) *pkgResult {
	res := &pkgResult{pkg: pkg, found: make(map[string]bool)}
	if fatal := loadErrors(pkg); len(fatal) > 0 {
		res.diags = fatal
		res.loadFailed = true
		return res
	}
	a := &analyzer{
		pkg:       pkg,
		fset:      pkg.Fset,
		self:      pkg.Types,
		specs:     make(map[*types.TypeName]*ast.TypeSpec),
		marked:    make(map[*types.TypeName]bool),
		wireNames: make(map[*types.TypeName]string),
		files:     make(map[string]*ast.File),
	}
	a.indexDecls()
	a.addServices(names, res.found)
	a.checkNames()
	if a.invalid || a.typeErrorInService() {
		a.addTypeErrors()
	}
	res.services = len(a.services)
	res.warnings = sortDiags(a.warnings)
	res.diags = sortDiags(a.diags)
	if len(res.diags) > 0 {
		return res
	}

	res.files, res.diags = a.generateFiles()
	if len(res.diags) > 0 {
		res.files = nil
		return res
	}
	if len(names) == 0 {
		res.stale = a.staleFiles(ld, res.files)
	}
	return res
}

// loadErrors returns what keeps pkg from being analyzed at all: errors of loading it other
// than type errors (judged later: they may be about what is to be generated), or no type
// information.
func loadErrors(pkg *packages.Package) []diag {
	var fatal []diag
	for _, e := range pkg.Errors {
		switch {
		case e.Kind == packages.TypeError: // judged once the services are known
		case e.Kind == packages.ListError && strings.HasPrefix(e.Msg, "# "+pkg.PkgPath+"\n"):
			// The go command failed to compile the package (go/packages asks it for
			// export data): these are the type errors again, seen by the compiler.
		default:
			fatal = append(fatal, packageError(e))
		}
	}
	if len(fatal) == 0 && (pkg.Types == nil || pkg.TypesInfo == nil) {
		fatal = append(fatal, diag{msg: fmt.Sprintf("package %s: no type information", pkg.PkgPath)})
	}
	return fatal
}

// addServices adds the services to check: the types named, if any (found records which
// exist), or else those marked with //mwrpc:service, in source order.
func (a *analyzer) addServices(names []string, found map[string]bool) {
	if len(names) > 0 {
		for _, name := range names {
			obj := a.self.Scope().Lookup(name)
			if obj == nil {
				continue
			}
			found[name] = true
			a.addNamed(name, obj)
		}
		return
	}
	var marked []*types.TypeName
	for tn := range a.marked {
		marked = append(marked, tn)
	}
	sort.Slice(marked, func(i, j int) bool { return a.before(marked[i].Pos(), marked[j].Pos()) })
	for _, tn := range marked {
		a.addMarked(tn)
	}
}

// addTypeErrors reports the package's type errors where a service's declaration is
// incomplete: the errors, not their consequences, leaving out uses of what is about to be
// generated.
func (a *analyzer) addTypeErrors() {
	generated := make(map[string]bool)
	for _, s := range a.services {
		for _, n := range s.generatedNames() {
			generated["undefined: "+n] = true
		}
	}
	n := len(a.diags)
	for _, e := range a.pkg.TypeErrors {
		if !generated[e.Msg] {
			a.diags = append(a.diags, diag{pos: e.Fset.Position(e.Pos), msg: e.Msg})
		}
	}
	if len(a.diags) == n {
		a.diags = append(a.diags, diag{msg: fmt.Sprintf("package %s: a service declaration does not type-check", a.pkg.PkgPath)})
	}
}

// indexDecls records the files of the package, the declaration of each package-level
// type, and which of them carry the service marker.
func (a *analyzer) indexDecls() {
	for _, f := range a.pkg.Syntax {
		a.files[a.fset.PositionFor(f.Package, false).Filename] = f
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				tn, ok := a.pkg.TypesInfo.Defs[ts.Name].(*types.TypeName)
				if !ok {
					continue
				}
				a.specs[tn] = ts
				doc := ts.Doc
				if doc == nil && !gd.Lparen.IsValid() {
					doc = gd.Doc
				}
				if name, ok := marker(doc); ok {
					a.marked[tn] = true
					a.wireNames[tn] = name
				}
			}
		}
	}
}

// hasMarker reports whether the doc comment has the line //mwrpc:service.
// marker finds the //mwrpc:service line in doc and the wire name it gives, if any
// ("//mwrpc:service acme.kv.v1.KV"), as a proto package names a service.
func marker(doc *ast.CommentGroup) (name string, ok bool) {
	if doc == nil {
		return "", false
	}
	for _, c := range doc.List {
		rest, found := strings.CutPrefix(strings.TrimRight(c.Text, " \t"), serviceMarker)
		if found && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// validWireName reports what is wrong with a service name given by the marker, or "".
func validWireName(name string) string {
	if strings.ContainsAny(name, "/ \t") {
		return "it may not contain a slash or a space"
	}
	if len(name) > 200 {
		return "it is longer than 200 bytes"
	}
	return ""
}

// before orders positions by file name, then offset.
func (a *analyzer) before(p, q token.Pos) bool {
	pp, qq := a.fset.PositionFor(p, false), a.fset.PositionFor(q, false)
	if pp.Filename != qq.Filename {
		return pp.Filename < qq.Filename
	}
	return pp.Offset < qq.Offset
}

func (a *analyzer) errorf(pos token.Pos, format string, args ...any) {
	a.diags = append(a.diags, diag{pos: a.fset.Position(pos), msg: fmt.Sprintf(format, args...)})
}

// warnf records a warning at pos (once per position and message).
func (a *analyzer) warnf(pos token.Pos, format string, args ...any) {
	d := diag{pos: a.fset.Position(pos), msg: "warning: " + fmt.Sprintf(format, args...)}
	for _, w := range a.warnings {
		if w == d {
			return
		}
	}
	a.warnings = append(a.warnings, d)
}

// addNamed adds the object a -type flag names, which must be an interface type declared
// in the package.
func (a *analyzer) addNamed(name string, obj types.Object) {
	tn, ok := obj.(*types.TypeName)
	switch {
	case !ok:
		a.errorf(obj.Pos(), "-type %s: %s is a %s, not an interface type", name, name, objectKind(obj))
	case tn.IsAlias():
		a.errorf(obj.Pos(), "-type %s: %s is an alias; name the interface type it stands for", name, name)
	case !isInterface(tn):
		a.errorf(obj.Pos(), "-type %s: %s is not an interface type", name, name)
	default:
		a.addService(tn)
	}
}

// addMarked adds a type marked //mwrpc:service, which must be an interface.
func (a *analyzer) addMarked(tn *types.TypeName) {
	if tn.IsAlias() {
		a.errorf(tn.Pos(), "%s: %s marks an alias; mark the interface type it stands for", tn.Name(), serviceMarker)
		return
	}
	if !isInterface(tn) {
		a.errorf(tn.Pos(), "%s: %s marks a type that is not an interface", tn.Name(), serviceMarker)
		return
	}
	a.addService(tn)
}

// objectKind describes a package-level object that is not a type.
func objectKind(obj types.Object) string {
	switch obj.(type) {
	case *types.Var:
		return "variable"
	case *types.Const:
		return "constant"
	case *types.Func:
		return "function"
	}
	return "non-type"
}

func isInterface(tn *types.TypeName) bool {
	_, ok := tn.Type().Underlying().(*types.Interface)
	return ok
}

// addService checks the interface tn and its methods and, if they are all right (or
// errors were recorded), adds the service.
func (a *analyzer) addService(tn *types.TypeName) {
	named := tn.Type().(*types.Named)
	iface := named.Underlying().(*types.Interface)
	s := &service{
		name: tn.Name(),
		wire: a.self.Name() + "." + tn.Name(),
		obj:  tn,
		spec: a.specs[tn],
		file: a.fset.PositionFor(tn.Pos(), false).Filename,
		pos:  a.fset.Position(tn.Pos()),
	}
	if name, ok := a.wireNames[tn]; ok && name != "" {
		if problem := validWireName(name); problem != "" {
			a.errorf(tn.Pos(), "%s: %s %s: %s", s.name, serviceMarker, name, problem)
			return
		}
		s.wire = name
	}
	switch {
	case !tn.Exported():
		a.errorf(tn.Pos(), "%s: service interfaces must be exported", s.name)
		return
	case named.TypeParams().Len() > 0:
		a.errorf(tn.Pos(), "%s: service interfaces cannot have type parameters", s.name)
		return
	case !iface.IsMethodSet():
		a.errorf(tn.Pos(), "%s: an interface with a type constraint (a union, ~T or comparable) cannot be a service", s.name)
		return
	case iface.NumMethods() == 0:
		if a.hasInvalidEmbedded(iface) {
			a.invalid = true
			return
		}
		a.errorf(tn.Pos(), "%s: service interface has no methods; declare methods of the form M(ctx context.Context, req T) (R, error)", s.name)
		return
	}
	for m := range iface.Methods() {
		if mm := a.checkMethod(s, m); mm != nil {
			s.methods = append(s.methods, mm)
		}
	}
	sort.Slice(s.methods, func(i, j int) bool { return s.methods[i].name < s.methods[j].name })
	a.services = append(a.services, s)
}

// hasInvalidEmbedded reports whether iface embeds a type that did not type-check.
func (a *analyzer) hasInvalidEmbedded(iface *types.Interface) bool {
	for t := range iface.EmbeddedTypes() {
		if hasInvalid(t) {
			return true
		}
	}
	return false
}

// checkMethod checks the method m of s; it returns nil (after recording why) when the
// method cannot be generated.
func (a *analyzer) checkMethod(s *service, m *types.Func) *method {
	name := s.name + "." + m.Name()
	pos := m.Pos()
	sig := m.Signature()
	if sigHasInvalid(sig) {
		a.invalid = true
		return nil
	}
	if !m.Exported() {
		a.errorf(pos, "%s: unexported methods cannot be called remotely; export it or remove it from the interface", name)
		return nil
	}
	if m.Name() == clientOptionsMethod {
		a.errorf(pos, "%s: the generated client has a method of that name (it sets call options); rename the method", name)
		return nil
	}
	c := methodCheck{a: a, pos: pos, name: name, shape: m.Name() + "(ctx context.Context, req T) (R, error)", mm: &method{name: m.Name()}}
	ok := c.params(sig)
	respType, resultsOK := c.results(sig.Results())
	ok = resultsOK && ok
	if sig.Params().Len() == 2 && !sig.Variadic() {
		ok = c.request(sig.Params().At(1).Type()) && ok
	}
	if respType != nil {
		what := "response"
		if c.mm.serverStream {
			what = "stream message"
		}
		p, good := a.checkParam(pos, name, what, respType)
		c.mm.resp, ok = p, ok && good
	}
	if !ok {
		return nil
	}
	return c.mm
}

// sigHasInvalid reports whether a parameter or result of sig did not type-check.
func sigHasInvalid(sig *types.Signature) bool {
	for _, vars := range []*types.Tuple{sig.Params(), sig.Results()} {
		for v := range vars.Variables() {
			if hasInvalid(v.Type()) {
				return true
			}
		}
	}
	return false
}

// methodCheck is checkMethod's state for one method: where it is, its name as errors say
// it (Service.Method), the shape it should have, and the method it fills in.
type methodCheck struct {
	a     *analyzer
	pos   token.Pos
	name  string
	shape string
	mm    *method
}

// streamShapes says, after a method's shape, how streams are written.
const streamShapes = "or with streams of T, iter.Seq2[T, error] in place of req (client streaming), of (R, error) (server streaming), or both"

// params checks the count of sig's parameters, the context first and no variadic one.
func (c *methodCheck) params(sig *types.Signature) bool {
	params := sig.Params()
	if n := params.Len(); n != 2 {
		c.a.errorf(c.pos, "%s: has %s; want 2, as in %s", c.name, plural(n, "parameter"), c.shape)
		return false
	}
	ok := true
	if !isContext(params.At(0).Type()) {
		c.a.errorf(c.pos, "%s: the first parameter has type %s; want context.Context", c.name, c.a.typeString(params.At(0).Type()))
		ok = false
	}
	if sig.Variadic() {
		c.a.errorf(c.pos, "%s: a variadic request is not supported; want %s", c.name, c.shape)
		ok = false
	}
	return ok
}

// results checks the results: (R, error), or a server stream iter.Seq2[R, error] alone.
// It returns the response (or stream message) type, nil when there is none to check.
func (c *methodCheck) results(results *types.Tuple) (types.Type, bool) {
	switch n := results.Len(); {
	case n == 1:
		elem, isSeq, problem := seqElem(results.At(0).Type())
		switch {
		case !isSeq:
			c.a.errorf(c.pos, "%s: has 1 result; want 2, as in %s, %s", c.name, c.shape, streamShapes)
		case problem != "":
			c.a.errorf(c.pos, "%s: the result %s: %s", c.name, c.a.typeString(results.At(0).Type()), problem)
		default:
			c.mm.serverStream, c.mm.out = true, results.At(0).Type()
			return elem, true
		}
	case n != 2:
		c.a.errorf(c.pos, "%s: has %s; want 2, as in %s, %s", c.name, plural(n, "result"), c.shape, streamShapes)
	default:
		if _, isSeq, _ := seqElem(results.At(0).Type()); isSeq {
			c.a.errorf(c.pos, "%s: a server stream is returned alone, as iter.Seq2[R, error]: its errors are yielded in it", c.name)
		} else if !isError(results.At(1).Type()) {
			c.a.errorf(c.pos, "%s: the second result has type %s; want error", c.name, c.a.typeString(results.At(1).Type()))
		} else {
			c.mm.out = results.At(0).Type()
			return c.mm.out, true
		}
	}
	return nil, false
}

// request checks the request parameter: a value, or a client stream iter.Seq2[T, error].
func (c *methodCheck) request(reqType types.Type) bool {
	elem, isSeq, problem := seqElem(reqType)
	switch {
	case isSeq && problem != "":
		c.a.errorf(c.pos, "%s: the parameter %s: %s", c.name, c.a.typeString(reqType), problem)
		return false
	case isSeq:
		c.mm.clientStream, c.mm.in = true, reqType
		p, good := c.a.checkParam(c.pos, c.name, "stream message", elem)
		c.mm.req = p
		return good
	default:
		c.mm.in = reqType
		p, good := c.a.checkParam(c.pos, c.name, "request", reqType)
		c.mm.req = p
		return good
	}
}

// seqElem reports whether t is an iterator type from package iter, and for
// iter.Seq2[T, error] returns T; problem says what is wrong with any other.
func seqElem(t types.Type) (elem types.Type, isSeq bool, problem string) {
	n, ok := types.Unalias(t).(*types.Named)
	if !ok || n.Obj().Pkg() == nil || n.Obj().Pkg().Path() != "iter" {
		return nil, false, ""
	}
	args := n.TypeArgs()
	switch {
	case n.Obj().Name() == "Seq":
		return nil, true, "a stream is iter.Seq2[T, error], so that its end can say why; iter.Seq has no error"
	case n.Obj().Name() != "Seq2" || args.Len() != 2:
		return nil, true, "a stream is iter.Seq2[T, error]"
	case !isError(args.At(1)):
		return nil, true, fmt.Sprintf("a stream is iter.Seq2[T, error]; its second type is %s", args.At(1))
	}
	return args.At(0), true, ""
}

// checkParam classifies a request or response type (what is "request" or "response").
func (a *analyzer) checkParam(pos token.Pos, name, what string, t types.Type) (param, bool) {
	p, ok := classify(t)
	if !ok {
		hint := ""
		if _, isChan := t.Underlying().(*types.Chan); isChan {
			hint = " (a stream is iter.Seq2[T, error])"
		}
		a.errorf(pos, "%s: %s type %s is not supported; %s%s", name, what, a.describe(t), allowedTypes, hint)
		return p, false
	}
	if problem := a.unnameable(t); problem != "" {
		a.errorf(pos, "%s: %s type %s cannot be used in generated code: %s", name, what, a.typeString(t), problem)
		return p, false
	}
	return p, a.checkTravel(name, what, t)
}

// classify reports how t travels, or false when it is not an allowed request or
// response type.
func classify(t types.Type) (param, bool) {
	switch u := types.Unalias(t).(type) {
	case *types.Pointer:
		if _, ok := u.Elem().Underlying().(*types.Struct); ok {
			return param{typ: t, kind: kindPointer, elem: u.Elem()}, true
		}
		return param{}, false
	case *types.Slice:
		if b, ok := types.Unalias(u.Elem()).(*types.Basic); ok && b.Kind() == types.Byte {
			return param{typ: t, kind: kindBytes}, true
		}
		return param{}, false
	}
	switch u := t.Underlying().(type) {
	case *types.Struct:
		return param{typ: t, kind: kindValue}, true
	case *types.Basic:
		switch u.Kind() {
		case types.Bool, types.String,
			types.Int, types.Int8, types.Int16, types.Int32, types.Int64,
			types.Uint, types.Uint8, types.Uint16, types.Uint32, types.Uint64,
			types.Float32, types.Float64:
			return param{typ: t, kind: kindValue}, true
		}
	}
	return param{}, false
}

// unnameable explains why the generated code, in the service's package, cannot spell t
// (or returns ""): t refers to an unexported type or field of another package, or to a
// type of the service's package named like a local name of the generated code.
func (a *analyzer) unnameable(t types.Type) string {
	sp := spelling{self: a.self.Path(), seen: make(map[types.Type]bool)}
	return sp.walk(t)
}

// spelling is unnameable's walk through a type: self is the service's package, seen the
// types already walked (types may refer to themselves).
type spelling struct {
	self string
	seen map[types.Type]bool
}

// walk returns the first reason found in t, or "".
func (sp *spelling) walk(t types.Type) string {
	if sp.seen[t] {
		return ""
	}
	sp.seen[t] = true
	switch t := t.(type) {
	case *types.Alias:
		return sp.named(t.Obj(), t.TypeArgs())
	case *types.Named:
		return sp.named(t.Obj(), t.TypeArgs())
	case *types.Pointer:
		return sp.walk(t.Elem())
	case *types.Slice:
		return sp.walk(t.Elem())
	case *types.Array:
		return sp.walk(t.Elem())
	case *types.Map:
		return sp.first(t.Key(), t.Elem())
	case *types.Chan:
		return sp.walk(t.Elem())
	case *types.Struct:
		return sp.fields(t)
	case *types.Signature:
		return sp.first(tupleTypes(t.Params(), t.Results())...)
	case *types.Interface:
		return sp.methods(t)
	}
	return ""
}

// first walks ts in order and returns the first reason found.
func (sp *spelling) first(ts ...types.Type) string {
	for _, t := range ts {
		if p := sp.walk(t); p != "" {
			return p
		}
	}
	return ""
}

// named checks a named type (or alias) and its type arguments.
func (sp *spelling) named(obj *types.TypeName, args *types.TypeList) string {
	if p := sp.object(obj); p != "" {
		return p
	}
	return sp.first(slices.Collect(args.Types())...)
}

// object checks the name of a type: unexported in another package, or in the service's
// package named like a local name of the generated code.
func (sp *spelling) object(obj *types.TypeName) string {
	switch {
	case obj.Pkg() == nil:
		return ""
	case obj.Pkg().Path() != sp.self:
		if !obj.Exported() {
			return fmt.Sprintf("%s.%s is not exported", obj.Pkg().Name(), obj.Name())
		}
		return ""
	case localNames[obj.Name()]:
		return fmt.Sprintf("the type name %s is also a local name in the generated code; rename the type", obj.Name())
	}
	return ""
}

// fields checks a struct's fields: none unexported in another package, each type spelled.
func (sp *spelling) fields(t *types.Struct) string {
	for f := range t.Fields() {
		if sp.hidden(f) {
			return fmt.Sprintf("its field %s is unexported in package %s", f.Name(), f.Pkg().Path())
		}
		if p := sp.walk(f.Type()); p != "" {
			return p
		}
	}
	return ""
}

// methods checks an interface's methods (none unexported in another package, each
// signature spelled), then what it embeds.
func (sp *spelling) methods(t *types.Interface) string {
	for m := range t.ExplicitMethods() {
		if sp.hidden(m) {
			return fmt.Sprintf("its method %s is unexported in package %s", m.Name(), m.Pkg().Path())
		}
		if p := sp.walk(m.Type()); p != "" {
			return p
		}
	}
	return sp.first(slices.Collect(t.EmbeddedTypes())...)
}

// hidden reports whether obj (a field or a method) is unexported in another package than
// the service's: generated code cannot spell a type that has one.
func (sp *spelling) hidden(obj types.Object) bool {
	return !obj.Exported() && obj.Pkg() != nil && obj.Pkg().Path() != sp.self
}

// tupleTypes returns the types of the variables of each tuple in turn.
func tupleTypes(tuples ...*types.Tuple) []types.Type {
	var ts []types.Type
	for _, tup := range tuples {
		for v := range tup.Variables() {
			ts = append(ts, v.Type())
		}
	}
	return ts
}

// hasInvalid reports whether t is, or is built directly from, the invalid type that
// go/types records where a declaration did not type-check.
func hasInvalid(t types.Type) bool {
	for {
		switch u := types.Unalias(t).(type) {
		case *types.Basic:
			return u.Kind() == types.Invalid
		case *types.Pointer:
			t = u.Elem()
		case *types.Slice:
			t = u.Elem()
		case *types.Array:
			t = u.Elem()
		case *types.Chan:
			t = u.Elem()
		case *types.Map:
			if hasInvalid(u.Key()) {
				return true
			}
			t = u.Elem()
		default:
			return false
		}
	}
}

// isContext reports whether t is context.Context.
func isContext(t types.Type) bool {
	n, ok := types.Unalias(t).(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "context" && n.Obj().Name() == "Context"
}

// isError reports whether t is the predeclared error.
func isError(t types.Type) bool {
	return types.Identical(t, types.Universe.Lookup("error").Type())
}

// describe writes t for a message, with what a named type or an alias stands for.
func (a *analyzer) describe(t types.Type) string {
	switch t := t.(type) {
	case *types.Alias:
		return fmt.Sprintf("%s (an alias of %s)", a.typeString(t), a.describe(types.Unalias(t)))
	case *types.Named:
		switch u := t.Underlying().(type) {
		case *types.Interface:
			return fmt.Sprintf("%s (an interface)", a.typeString(t))
		case *types.Struct:
		default:
			return fmt.Sprintf("%s (underlying type %s)", a.typeString(t), a.typeString(u))
		}
	}
	return a.typeString(t)
}

// typeString writes t for a message: types of the package itself unqualified, others
// qualified by package name.
func (a *analyzer) typeString(t types.Type) string {
	return types.TypeString(t, func(p *types.Package) string {
		if p.Path() == a.self.Path() {
			return ""
		}
		return p.Name()
	})
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// checkNames reports generated names that collide with declarations of the package or
// with each other.
func (a *analyzer) checkNames() {
	owner := make(map[string]*service)
	for _, s := range a.services {
		for _, n := range s.generatedNames() {
			if obj := a.self.Scope().Lookup(n); obj != nil {
				a.errorf(s.obj.Pos(), "%s: the package already declares %s (at %s), which mwrpcgen generates for service %s; rename one of them",
					s.name, n, filepath.Base(a.fset.Position(obj.Pos()).String()), s.name)
			}
			if o := owner[n]; o != nil && o != s {
				a.errorf(s.obj.Pos(), "%s: services %s and %s would both declare %s; rename one of them", s.name, o.name, s.name, n)
			}
			owner[n] = s
		}
	}
}

// typeErrorInService reports whether a type error lies inside the declaration of a
// service.
func (a *analyzer) typeErrorInService() bool {
	for _, e := range a.pkg.TypeErrors {
		for _, s := range a.services {
			if s.spec != nil && s.spec.Pos() <= e.Pos && e.Pos < s.spec.End() {
				return true
			}
		}
	}
	return false
}

// generateFiles writes the code of the services, one output per input file.
func (a *analyzer) generateFiles() ([]genFile, []diag) {
	// Services in declaration order, whatever the order of the -type list.
	sort.SliceStable(a.services, func(i, j int) bool { return a.before(a.services[i].obj.Pos(), a.services[j].obj.Pos()) })
	byFile := make(map[string][]*service)
	for _, s := range a.services {
		byFile[s.file] = append(byFile[s.file], s)
	}
	var files []string
	for f := range byFile {
		files = append(files, f)
	}
	sort.Strings(files)

	taken := make(map[string]bool)
	for _, n := range a.self.Scope().Names() {
		taken[n] = true
	}
	for _, s := range a.services {
		for _, n := range s.generatedNames() {
			taken[n] = true
		}
	}

	var out []genFile
	var diags []diag
	for _, file := range files {
		svcs := byFile[file]
		expr, err := outputConstraint(file, a.files[file])
		if err != nil {
			diags = append(diags, diag{pos: token.Position{Filename: file}, msg: err.Error()})
			continue
		}
		src, err := emitFile(a.self, svcs, expr, taken)
		if err != nil {
			diags = append(diags, diag{pos: token.Position{Filename: file}, msg: "internal error: " + err.Error()})
			continue
		}
		gf := genFile{path: strings.TrimSuffix(file, ".go") + outputSuffix, src: src}
		if old, err := os.ReadFile(gf.path); err == nil && !isGenerated(gf.path, old) {
			diags = append(diags, diag{pos: token.Position{Filename: file},
				msg: fmt.Sprintf("cannot write %s: the file exists and mwrpcgen did not write it", filepath.Base(gf.path))})
			continue
		}
		for _, s := range svcs {
			gf.services = append(gf.services, s.name)
		}
		out = append(out, gf)
	}
	return out, diags
}

// staleFiles returns the earlier outputs in the package that this run does not write.
func (a *analyzer) staleFiles(ld *loader, outputs []genFile) []string {
	keep := make(map[string]bool)
	for _, f := range outputs {
		keep[f.path] = true
	}
	var stale []string
	for _, f := range a.pkg.GoFiles {
		if ld.isGeneratedFile(f) && !keep[f] {
			stale = append(stale, f)
		}
	}
	sort.Strings(stale)
	return stale
}
