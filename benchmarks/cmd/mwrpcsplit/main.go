// Command mwrpcsplit splits a CPU profile by mwrpc package: each sample counts for the
// innermost frame of the mwrpc module outside its internal/ helpers (the idle polling,
// the clock, the probes), so the runtime, sync and atomics count where mwrpc's code
// called them, and a sample with no such frame (the collector, the scheduler's own loop)
// counts apart. Where a flat profile spreads a small call's CPU over forty functions of
// a few percent each, this says which layer the time is in: the soft NIC, the transport,
// the shm rings, the rpc layer.
//
//	mwrpcsplit [-by function] PROFILE...
//
// It prints a Markdown table per profile: package (or, with -by function, the function
// the sample was charged to), seconds, share. The harness writes the profiles
// (mwrpcbench -cpuprofile and -server-cpuprofile); scripts/lease-unpack.sh runs this on
// a many-core lease's.
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// module is the prefix of mwrpc's function names; helpers are the packages under it
// whose time counts for their caller.
const (
	module  = "github.com/mwrpc/mwrpc/"
	helpers = "internal/"
	noFrame = "(no mwrpc frame)"
)

func main() {
	by := flag.String("by", "package", "what a sample is charged to: package or function (its innermost mwrpc frame outside internal/)")
	flag.Parse()
	if flag.NArg() == 0 || *by != "package" && *by != "function" {
		fmt.Fprintln(os.Stderr, "usage: mwrpcsplit [-by package|function] PROFILE...")
		os.Exit(2)
	}
	for _, path := range flag.Args() {
		if err := report(os.Stdout, path, *by == "function"); err != nil {
			fmt.Fprintln(os.Stderr, "mwrpcsplit:", err)
			os.Exit(1)
		}
	}
}

// report prints the split of the CPU profile at path, by function if byFunc, else by
// package.
func report(w io.Writer, path string, byFunc bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	shares, err := split(p, byFunc)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	what := "package"
	if byFunc {
		what = "function"
	}
	fmt.Fprintf(w, "%s\n\n", path)
	writeTable(w, shares, what)
	fmt.Fprintln(w)
	return nil
}

// share is one package's (or function's) CPU time in a profile.
type share struct {
	name string // a package, or a function
	time time.Duration
}

// split charges each sample of p to its package (or function, if byFunc) and returns
// them, most time first.
func split(p *profile.Profile, byFunc bool) ([]share, error) {
	idx := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "cpu" && t.Unit == "nanoseconds" })
	if idx < 0 {
		return nil, errors.New("not a CPU profile: no cpu/nanoseconds sample type")
	}
	by := map[string]time.Duration{}
	for _, s := range p.Sample {
		pkg, fn := chargedTo(s.Location)
		if byFunc {
			pkg = fn
		}
		by[pkg] += time.Duration(s.Value[idx])
	}
	shares := make([]share, 0, len(by))
	for name, t := range by {
		shares = append(shares, share{name, t})
	}
	slices.SortFunc(shares, func(a, b share) int {
		return cmp.Or(cmp.Compare(b.time, a.time), strings.Compare(a.name, b.name))
	})
	return shares, nil
}

// chargedTo returns the innermost frame of a sample's stack (leaf first; a location's
// lines innermost first, as inlined calls are) that lies in the module and outside its
// helpers: its package and its function, both without the module's prefix; noFrame for
// both if there is none.
func chargedTo(stack []*profile.Location) (pkg, fn string) {
	for _, loc := range stack {
		for _, line := range loc.Line {
			if line.Function == nil {
				continue
			}
			name, ok := strings.CutPrefix(line.Function.Name, module)
			if !ok {
				continue
			}
			// A package path has no dot here; the first dot ends it (transport.(*Conn).call,
			// transport/verbs/soft.(*QP).post, and generic names with paths in brackets).
			pkg, _, _ = strings.Cut(name, ".")
			if !strings.HasPrefix(pkg, helpers) {
				return pkg, name
			}
		}
	}
	return noFrame, noFrame
}

// writeTable prints shares as a Markdown table with their total; what names the first
// column.
func writeTable(w io.Writer, shares []share, what string) {
	var total time.Duration
	for _, s := range shares {
		total += s.time
	}
	fmt.Fprintf(w, "| %s | CPU | share |\n", what)
	fmt.Fprintln(w, "|---|---:|---:|")
	for _, s := range shares {
		fmt.Fprintf(w, "| %s | %.2fs | %.1f%% |\n", s.name, s.time.Seconds(), 100*s.time.Seconds()/max(total.Seconds(), 1e-9))
	}
	fmt.Fprintf(w, "| total | %.2fs | |\n", total.Seconds())
}
