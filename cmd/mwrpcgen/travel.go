package main

import (
	"go/token"
	"go/types"
	"reflect"
	"strings"
)

// checkTravel walks what a request or response type carries (struct fields, elements of
// slices, arrays and maps, pointers, recursively) and reports, at the field and with its
// path (GetRequest.Opts.Ch), what the msgpack codec cannot carry: channels, functions,
// unsafe.Pointer, complex numbers, and interfaces other than any (msgpack cannot know
// what concrete type to decode into). Fields tagged msgpack:"-" do not travel and are not
// checked; a type that encodes itself (msgpack's EncodeMsgpack or MarshalMsgpack,
// encoding's MarshalBinary or MarshalText) is taken as it is. Unexported fields do not
// travel: each becomes a warning.
func (a *analyzer) checkTravel(name, what string, t types.Type) bool {
	w := travelWalk{a: a, method: name, what: what, seen: make(map[types.Type]bool), ok: true}
	root := types.TypeString(t, types.RelativeTo(a.self))
	root = strings.TrimPrefix(root, "*")
	w.walk(t, root, token.NoPos)
	return w.ok
}

type travelWalk struct {
	a            *analyzer
	method, what string
	seen         map[types.Type]bool
	ok           bool
}

// refuse reports a field that cannot travel; the walk goes on, so that every one is.
func (w *travelWalk) refuse(pos token.Pos, path, why string) {
	w.a.errorf(pos, "%s: %s field %s is %s, which the msgpack codec cannot carry; change its type, or tag it msgpack:\"-\" to leave it out",
		w.method, w.what, path, why)
	w.ok = false
}

func (w *travelWalk) walk(t types.Type, path string, pos token.Pos) {
	if named, ok := types.Unalias(t).(*types.Named); ok {
		if w.seen[named] {
			return
		}
		w.seen[named] = true
		if encodesItself(named) {
			return
		}
	}
	switch u := t.Underlying().(type) {
	case *types.Chan:
		w.refuse(pos, path, "a channel")
	case *types.Signature:
		w.refuse(pos, path, "a function")
	case *types.Interface:
		if !u.Empty() {
			w.refuse(pos, path, "an interface ("+types.TypeString(t, types.RelativeTo(w.a.self))+")")
		}
	case *types.Basic:
		switch u.Kind() {
		case types.UnsafePointer:
			w.refuse(pos, path, "an unsafe.Pointer")
		case types.Complex64, types.Complex128:
			w.refuse(pos, path, "a complex number")
		}
	case *types.Pointer:
		w.walk(u.Elem(), path, pos)
	case *types.Slice:
		w.walk(u.Elem(), path+"[]", pos)
	case *types.Array:
		w.walk(u.Elem(), path+"[]", pos)
	case *types.Map:
		w.walk(u.Key(), path+"[key]", pos)
		w.walk(u.Elem(), path+"[]", pos)
	case *types.Struct:
		for i := 0; i < u.NumFields(); i++ {
			f := u.Field(i)
			tag := reflect.StructTag(u.Tag(i)).Get("msgpack")
			if tag == "-" {
				continue
			}
			fpath := path + "." + f.Name()
			if !f.Exported() && !f.Embedded() {
				if f.Name() != "_msgpack" && f.Name() != "_" {
					w.a.warnf(f.Pos(), "%s: %s field %s is unexported: it does not travel (the other side gets its zero value)", w.method, w.what, fpath)
				}
				continue
			}
			w.walk(f.Type(), fpath, f.Pos())
		}
	}
}

// encodesItself reports whether t (or *t) has a method msgpack encodes it with.
func encodesItself(t *types.Named) bool {
	for _, typ := range []types.Type{t, types.NewPointer(t)} {
		ms := types.NewMethodSet(typ)
		for _, m := range []string{"EncodeMsgpack", "MarshalMsgpack", "MarshalBinary", "MarshalText"} {
			if ms.Lookup(nil, m) != nil {
				return true
			}
		}
	}
	return false
}
