package main

import (
	"fmt"
	"go/ast"
	"go/build/constraint"
	"path/filepath"
	"strings"
)

// outputConstraint returns the //go:build expression of the file generated from the
// source file filename (parsed as f), or "" when it needs none: the source's own
// constraint (its //go:build line, or its // +build lines), and-ed with the GOOS and
// GOARCH that the source's name implies (kv_linux.go), which the output's name
// (kv_linux_mwrpc.go) no longer does.
func outputConstraint(filename string, f *ast.File) (string, error) {
	var exprs []constraint.Expr
	if f != nil {
		var goBuild constraint.Expr
		var plusBuild []constraint.Expr
		for _, cg := range f.Comments {
			if cg.Pos() >= f.Package {
				break
			}
			for _, c := range cg.List {
				switch {
				case constraint.IsGoBuild(c.Text):
					x, err := constraint.Parse(c.Text)
					if err != nil {
						return "", fmt.Errorf("cannot copy the build constraint: %v", err)
					}
					if goBuild == nil {
						goBuild = x
					}
				case constraint.IsPlusBuild(c.Text):
					x, err := constraint.Parse(c.Text)
					if err != nil {
						return "", fmt.Errorf("cannot copy the build constraint: %v", err)
					}
					plusBuild = append(plusBuild, x)
				}
			}
		}
		if goBuild != nil {
			exprs = append(exprs, goBuild) // //go:build wins over // +build
		} else {
			exprs = append(exprs, plusBuild...)
		}
	}
	exprs = append(exprs, fileNameTags(filename)...)
	if len(exprs) == 0 {
		return "", nil
	}
	x := exprs[0]
	for _, y := range exprs[1:] {
		x = &constraint.AndExpr{X: x, Y: y}
	}
	return x.String(), nil
}

// fileNameTags returns the GOOS and GOARCH tags that the name of a Go file implies, as
// go/build reads them: name_GOOS.go, name_GOARCH.go or name_GOOS_GOARCH.go (and the same
// with _test before .go).
func fileNameTags(filename string) []constraint.Expr {
	name, _, _ := strings.Cut(filepath.Base(filename), ".")
	i := strings.IndexByte(name, '_')
	if i < 0 {
		return nil // the part before the first underscore never counts
	}
	parts := strings.Split(name[i+1:], "_")
	if n := len(parts); n > 0 && parts[n-1] == "test" {
		parts = parts[:n-1]
	}
	n := len(parts)
	tag := func(s string) constraint.Expr { return &constraint.TagExpr{Tag: s} }
	switch {
	case n >= 2 && knownOS[parts[n-2]] && knownArch[parts[n-1]]:
		return []constraint.Expr{tag(parts[n-2]), tag(parts[n-1])}
	case n >= 1 && (knownOS[parts[n-1]] || knownArch[parts[n-1]]):
		return []constraint.Expr{tag(parts[n-1])}
	}
	return nil
}

// knownOS and knownArch are the GOOS and GOARCH values that go/build recognizes in file
// names (the lists in the Go distribution's internal/syslist), including ones no port
// exists for yet.
var (
	knownOS = setOf("aix", "android", "darwin", "dragonfly", "freebsd", "hurd", "illumos",
		"ios", "js", "linux", "nacl", "netbsd", "openbsd", "plan9", "solaris", "wasip1",
		"windows", "zos")
	knownArch = setOf("386", "amd64", "amd64p32", "arm", "armbe", "arm64", "arm64be",
		"loong64", "mips", "mipsle", "mips64", "mips64le", "mips64p32", "mips64p32le", "ppc",
		"ppc64", "ppc64le", "riscv", "riscv64", "s390", "s390x", "sparc", "sparc64", "wasm")
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}
