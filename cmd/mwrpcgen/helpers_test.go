package main

import (
	"go/parser"
	"go/token"
	"slices"
	"testing"
)

func TestOutputConstraint(t *testing.T) {
	tests := []struct {
		file, src string
		want      string // "" for none; "error" when it fails
	}{
		{"kv.go", "package p\n", ""},
		{"kv.go", "//go:build linux && !race\n\npackage p\n", "linux && !race"},
		{"kv.go", "// Copyright.\n\n//go:build a || b\n\n// Package p.\npackage p\n", "a || b"},
		{"kv_linux.go", "package p\n", "linux"},
		{"kv_arm64.go", "package p\n", "arm64"},
		{"kv_linux_arm64.go", "package p\n", "linux && arm64"},
		{"kv_linux_test.go", "package p\n", "linux"},
		{"kv_amd64_linux.go", "package p\n", "linux"}, // GOARCH_GOOS is not a pair: only the last counts
		{"kv_windows.go", "//go:build a || b\n\npackage p\n", "(a || b) && windows"},
		{"linux.go", "package p\n", ""}, // the part before the first underscore never counts
		{"kv.v1_linux.go", "package p\n", ""},
		{"kv_mwrpc.go", "package p\n", ""},
		{"kv.go", "// +build a b\n// +build c\n\npackage p\n", "(a || b) && c"},
		{"kv.go", "//go:build x\n// +build y\n\npackage p\n", "x"},
		{"kv.go", "package p\n\n//go:build x\n", ""}, // after the package clause: not a constraint
		{"kv.go", "//go:build (\n\npackage p\n", "error"},
	}
	for _, tt := range tests {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, tt.file, tt.src, parser.ParseComments)
		if err != nil {
			t.Fatalf("%s: %v", tt.file, err)
		}
		got, err := outputConstraint("/src/"+tt.file, f)
		if err != nil {
			got = "error"
		}
		if got != tt.want {
			t.Errorf("outputConstraint(%s, %q) = %q (%v); want %q", tt.file, tt.src, got, err, tt.want)
		}
	}
}

func TestParseTypeList(t *testing.T) {
	tests := []struct {
		in   string
		want []string // nil when it fails
	}{
		{"KV", []string{"KV"}},
		{"KV,Other", []string{"KV", "Other"}},
		{" KV , Other ,", []string{"KV", "Other"}},
		{"KV,KV", []string{"KV"}},
		{"", nil},
		{" , ", nil},
		{"a-b", nil},
		{"pkg.KV", nil},
	}
	for _, tt := range tests {
		got, err := parseTypeList(tt.in)
		if (err != nil) != (tt.want == nil) || !slices.Equal(got, tt.want) {
			t.Errorf("parseTypeList(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestParsePos(t *testing.T) {
	tests := []struct {
		in   string
		want token.Position
	}{
		{"", token.Position{}},
		{"-", token.Position{}},
		{"/a/kv.go", token.Position{Filename: "/a/kv.go"}},
		{"/a/kv.go:12", token.Position{Filename: "/a/kv.go", Line: 12}},
		{"/a/kv.go:12:2", token.Position{Filename: "/a/kv.go", Line: 12, Column: 2}},
		{`C:\a\kv.go:12:2`, token.Position{Filename: `C:\a\kv.go`, Line: 12, Column: 2}},
	}
	for _, tt := range tests {
		if got := parsePos(tt.in); got != tt.want {
			t.Errorf("parsePos(%q) = %+v; want %+v", tt.in, got, tt.want)
		}
	}
}

func TestDiagFormat(t *testing.T) {
	tests := []struct {
		d    diag
		base string
		want string
	}{
		{diag{msg: "no packages"}, "/a", "mwrpcgen: no packages"},
		{diag{pos: token.Position{Filename: "/a/kv.go", Line: 3, Column: 2}, msg: "m"}, "/a", "kv.go:3:2: m"},
		{diag{pos: token.Position{Filename: "/a/b/kv.go", Line: 3, Column: 2}, msg: "m"}, "/a", "b/kv.go:3:2: m"},
		{diag{pos: token.Position{Filename: "/x/kv.go", Line: 3}, msg: "m"}, "/a", "../x/kv.go:3: m"},
		{diag{pos: token.Position{Filename: "/a/kv.go"}, msg: "m"}, "/a", "kv.go: m"},
	}
	for _, tt := range tests {
		if got := tt.d.format(tt.base); got != tt.want {
			t.Errorf("%+v.format(%q) = %q; want %q", tt.d, tt.base, got, tt.want)
		}
	}
}

func TestSortDiags(t *testing.T) {
	pos := func(file string, line, col int) token.Position {
		return token.Position{Filename: file, Line: line, Column: col}
	}
	in := []diag{
		{pos("b.go", 1, 1), "x"},
		{pos("a.go", 2, 1), "y"},
		{pos("a.go", 2, 1), "x"},
		{pos("a.go", 10, 1), "x"},
		{token.Position{}, "global"},
		{pos("a.go", 2, 1), "x"},
	}
	want := []diag{
		{token.Position{}, "global"},
		{pos("a.go", 2, 1), "x"},
		{pos("a.go", 2, 1), "y"},
		{pos("a.go", 10, 1), "x"},
		{pos("b.go", 1, 1), "x"},
	}
	if got := sortDiags(in); !slices.Equal(got, want) {
		t.Errorf("sortDiags = %v; want %v", got, want)
	}
}
