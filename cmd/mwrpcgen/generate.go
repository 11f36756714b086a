package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/tools/go/packages"
)

// options configure a run.
type options struct {
	dir   string    // where patterns are resolved and messages' paths are relative to
	tags  string    // build tags, comma-separated
	env   []string  // extra environment for the go command (KEY=value)
	types []string  // -type: the service interfaces; nil for those marked //mwrpc:service
	log   io.Writer // where -v reports; nil for quiet
	warn  io.Writer // where warnings go (unexported fields that do not travel); nil: nowhere
}

// generate loads the packages that patterns name and writes their generated files. It
// returns the problems found, sorted; a package with problems is left as it was. The
// error is for failures that are not about the code (the go command failing).
func generate(opts options, patterns []string) ([]diag, error) {
	ld := new(loader)
	pkgs, err := ld.load(opts.dir, opts.tags, opts.env, patterns...)
	if err != nil {
		return nil, err
	}
	results, diags := plan(ld, pkgs, opts.types, patterns)
	if opts.warn != nil {
		for _, r := range results {
			for _, w := range r.warnings {
				fmt.Fprintln(opts.warn, w.format(opts.dir))
			}
		}
	}
	if len(diags) > 0 {
		return diags, nil
	}
	for _, r := range results {
		if err := apply(r, opts); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// plan analyzes the packages and returns, for each, what to write and the problems
// found (all of them together, sorted). Problems that belong to no single package
// (a -type naming nothing, no services at all) are among them.
func plan(ld *loader, pkgs []*packages.Package, names []string, patterns []string) ([]*pkgResult, []diag) {
	var results []*pkgResult
	var diags []diag
	if len(pkgs) == 0 {
		return nil, []diag{{msg: fmt.Sprintf("no packages match %s", strings.Join(patterns, " "))}}
	}
	found := make(map[string]bool)
	services := 0
	loadFailed := false
	for _, pkg := range pkgs {
		r := analyzePackage(ld, pkg, names)
		results = append(results, r)
		diags = append(diags, r.diags...)
		for n := range r.found {
			found[n] = true
		}
		services += r.services
		loadFailed = loadFailed || r.loadFailed
	}
	for _, n := range names {
		if !found[n] && !loadFailed { // a package that did not load may declare it
			diags = append(diags, diag{msg: fmt.Sprintf("-type %s: no type %s in %s", n, n, packageList(pkgs))})
		}
	}
	if len(names) == 0 && services == 0 && len(diags) == 0 {
		diags = append(diags, diag{msg: fmt.Sprintf("no service interfaces in %s; mark one with a %s line in its doc comment, or name it with -type",
			packageList(pkgs), serviceMarker)})
	}
	return results, sortDiags(diags)
}

// packageList names the packages for a message.
func packageList(pkgs []*packages.Package) string {
	if len(pkgs) == 1 {
		return "package " + pkgs[0].PkgPath
	}
	var paths []string
	for _, p := range pkgs {
		paths = append(paths, p.PkgPath)
	}
	return "packages " + strings.Join(paths, ", ")
}

// apply writes a package's generated files (those whose contents changed) and deletes
// its stale ones.
func apply(r *pkgResult, opts options) error {
	for _, f := range r.files {
		old, err := os.ReadFile(f.path)
		if err == nil && bytes.Equal(old, f.src) {
			opts.logf("%s is up to date (%s)", relPath(opts.dir, f.path), strings.Join(f.services, ", "))
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.WriteFile(f.path, f.src, 0o666); err != nil {
			return err
		}
		opts.logf("wrote %s (%s)", relPath(opts.dir, f.path), strings.Join(f.services, ", "))
	}
	for _, path := range r.stale {
		if err := os.Remove(path); err != nil {
			return err
		}
		opts.logf("removed %s: its source file declares no service any more", relPath(opts.dir, path))
	}
	return nil
}

func (o options) logf(format string, args ...any) {
	if o.log != nil {
		fmt.Fprintf(o.log, "mwrpcgen: "+format+"\n", args...)
	}
}
