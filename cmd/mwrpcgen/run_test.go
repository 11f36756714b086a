package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun runs the command, as go generate would, in a package it writes into: a
// directory under testdata/ (inside the module, so that the package can import mwrpc's
// rpc; go build ./... ignores it), removed when the test ends.
func TestRun(t *testing.T) {
	rel, err := os.MkdirTemp("testdata", "run-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rel) })
	dir, err := filepath.Abs(rel)
	if err != nil {
		t.Fatal(err)
	}
	pkgPath := "github.com/mwrpc/mwrpc/cmd/mwrpcgen/" + filepath.ToSlash(rel)

	kvSrc := readFile(t, "testdata/pointer/kv.go")
	golden := readFile(t, "testdata/pointer/kv_mwrpc.go.golden")
	marked := strings.Replace(kvSrc, "// KV is a key-value store.\n", "// KV is a key-value store.\n//\n//mwrpc:service\n", 1)
	if marked == kvSrc {
		t.Fatal("testdata/pointer/kv.go: cannot add the marker")
	}

	type step struct {
		name   string
		before func(t *testing.T) // changes the package
		args   []string
		code   int
		stderr string            // the exact report; with "..." at the end, its start
		files  map[string]string // the generated files afterwards, by name
	}
	// GetReq with an unexported field: a warning, and the same stubs.
	hidden := strings.Replace(marked, "type GetReq struct{ Key string }", "type GetReq struct {\n\tKey    string\n\tsecret int\n}", 1)
	if hidden == marked {
		t.Fatal("testdata/pointer/kv.go: cannot add a field to GetReq")
	}
	hiddenLine := strings.Count(hidden[:strings.Index(hidden, "\tsecret int")], "\n") + 1
	writeKV := func(src string) func(t *testing.T) {
		return func(t *testing.T) { writeFile(t, filepath.Join(dir, "kv.go"), src) }
	}
	steps := []step{
		{
			name: "writes", before: writeKV(kvSrc),
			args: []string{"-v", "-type", "KV"}, code: 0,
			stderr: "mwrpcgen: wrote kv_mwrpc.go (KV)\n",
			files:  map[string]string{"kv_mwrpc.go": golden},
		},
		{
			name: "leaves an up-to-date file", args: []string{"-v", "-type", "KV"}, code: 0,
			stderr: "mwrpcgen: kv_mwrpc.go is up to date (KV)\n",
			files:  map[string]string{"kv_mwrpc.go": golden},
		},
		{
			name: "quiet", args: []string{"-type=KV", "."}, code: 0, stderr: "",
			files: map[string]string{"kv_mwrpc.go": golden},
		},
		{
			name: "unknown -type", args: []string{"-type", "KV,Nope"}, code: 1,
			stderr: "mwrpcgen: -type Nope: no type Nope in package " + pkgPath + "\n",
			files:  map[string]string{"kv_mwrpc.go": golden},
		},
		{
			name: "no marked interface", args: nil, code: 1,
			stderr: "mwrpcgen: no service interfaces in package " + pkgPath + "; mark one with a //mwrpc:service line in its doc comment, or name it with -type\n",
			files:  map[string]string{"kv_mwrpc.go": golden},
		},
		{
			name: "marked interface", before: writeKV(marked), args: []string{"-v"}, code: 0,
			stderr: "mwrpcgen: kv_mwrpc.go is up to date (KV)\n",
			files:  map[string]string{"kv_mwrpc.go": golden},
		},
		{
			name: "service moved to another file",
			before: func(t *testing.T) {
				if err := os.Rename(filepath.Join(dir, "kv.go"), filepath.Join(dir, "store.go")); err != nil {
					t.Fatal(err)
				}
			},
			args: []string{"-v"}, code: 0,
			stderr: "mwrpcgen: wrote store_mwrpc.go (KV)\nmwrpcgen: removed kv_mwrpc.go: its source file declares no service any more\n",
			files:  map[string]string{"store_mwrpc.go": golden},
		},
		{
			name: "bad method",
			before: func(t *testing.T) {
				src := strings.Replace(marked, "Put(context.Context, *PutReq)", "Put(context.Context, map[string]int)", 1)
				writeFile(t, filepath.Join(dir, "store.go"), src)
			},
			args: nil, code: 1,
			stderr: "store.go:14:2: KV.Put: request type map[string]int is not supported; use a pointer to a struct, a struct, []byte or a basic type\n",
			files:  map[string]string{"store_mwrpc.go": golden},
		},
		{
			name:   "unexported field",
			before: func(t *testing.T) { writeFile(t, filepath.Join(dir, "store.go"), hidden) },
			args:   nil, code: 0,
			stderr: fmt.Sprintf("store.go:%d:2: warning: KV.Get: request field GetReq.secret is unexported: it does not travel (the other side gets its zero value)\n", hiddenLine),
			files:  map[string]string{"store_mwrpc.go": golden},
		},
		{
			name: "hand-written output",
			before: func(t *testing.T) {
				writeFile(t, filepath.Join(dir, "store.go"), marked)
				writeFile(t, filepath.Join(dir, "store_mwrpc.go"), "package pointer\n")
			},
			args: nil, code: 1,
			stderr: "store.go: cannot write store_mwrpc.go: the file exists and mwrpcgen did not write it\n",
			files:  map[string]string{"store_mwrpc.go": "package pointer\n"},
		},
		{
			name: "-type not an identifier", args: []string{"-type", "a-b"}, code: 2,
			stderr: "mwrpcgen: -type: \"a-b\" is not a Go identifier\n",
		},
		{
			name: "empty -type", args: []string{"-type", " , "}, code: 2,
			stderr: "mwrpcgen: -type: no interface names given\n",
		},
		{
			name: "unknown flag", args: []string{"-x"}, code: 2,
			stderr: "flag provided but not defined: -x\nusage: mwrpcgen [-type KV,Other] [-tags tag,list] [-v] [packages]\n...",
		},
		{
			name: "help", args: []string{"-h"}, code: 0,
			stderr: "usage: mwrpcgen [-type KV,Other] [-tags tag,list] [-v] [packages]\n...",
		},
		{
			name: "no such package", args: []string{"./nosuchdir"}, code: 1,
			stderr: "mwrpcgen: ...",
		},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) {
			if s.before != nil {
				s.before(t)
			}
			var stderr strings.Builder
			code := run(dir, s.args, &stderr)
			if code != s.code {
				t.Errorf("exit status %d; want %d", code, s.code)
			}
			if prefix, ok := strings.CutSuffix(s.stderr, "..."); ok {
				if !strings.HasPrefix(stderr.String(), prefix) {
					t.Errorf("stderr:\n%s\nwant it to start with:\n%s", stderr.String(), prefix)
				}
			} else if stderr.String() != s.stderr {
				t.Errorf("stderr:\n%s\nwant:\n%s", stderr.String(), s.stderr)
			}
			if s.files == nil {
				return
			}
			generated, err := filepath.Glob(filepath.Join(dir, "*"+outputSuffix))
			if err != nil {
				t.Fatal(err)
			}
			if len(generated) != len(s.files) {
				t.Errorf("generated files %q; want %d", generated, len(s.files))
			}
			for name, want := range s.files {
				if got := readFile(t, filepath.Join(dir, name)); got != want {
					t.Errorf("%s:\n%s\nwant:\n%s", name, got, want)
				}
			}
		}) {
			break // the next steps build on this one
		}
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, name, src string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(src), 0o666); err != nil {
		t.Fatal(err)
	}
}
