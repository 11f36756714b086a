package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/tools/go/packages"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// goldenCase is a package under testdata/ and how mwrpcgen runs on it. The expected
// outputs are testdata/<name>/<output file>.golden; the expected errors,
// testdata/<name>/errors.golden.
type goldenCase struct {
	name    string   // directory under testdata/
	types   []string // -type; nil for the //mwrpc:service marker
	removed []string // earlier outputs the run deletes (base names)
	fails   bool     // the run reports errors and writes nothing
}

var goldenCases = []goldenCase{
	{name: "pointer", types: []string{"KV"}},
	{name: "value", types: []string{"Calc"}},
	{name: "raw", types: []string{"Store"}},
	{name: "imports", types: []string{"Catalog"}},
	{name: "discover", removed: []string{"old_mwrpc.go"}},
	{name: "buildtags"},
	{name: "wirename"},
	{name: "stream", types: []string{"Files"}},
	{name: "badsig", types: []string{"Bad", "Good", "BadStream"}, fails: true},
	{name: "badsvc", fails: true},
	{name: "badtype", types: []string{"KV", "Missing", "Req", "Value", "Alias", "Fn"}, fails: true},
	{name: "typeerr", types: []string{"KV"}, fails: true},
	{name: "badfields", types: []string{"Svc"}, fails: true},
}

// The build configuration of the tests' loads: the buildtags case needs both.
const testTags = "mwrpcdemo"

var testEnv = []string{"GOOS=linux"}

// loadedCases is every golden case's package, loaded once (packages.Load is slow).
var loadedCases struct {
	once sync.Once
	ld   *loader
	pkgs map[string]*packages.Package // by case name
	err  error
}

func caseDir(t *testing.T, name string) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// loadCase returns the loader and the package of a golden case.
func loadCase(t *testing.T, name string) (*loader, *packages.Package) {
	t.Helper()
	lc := &loadedCases
	lc.once.Do(func() {
		var patterns []string
		for _, c := range goldenCases {
			patterns = append(patterns, "./testdata/"+c.name)
		}
		lc.ld = new(loader)
		pkgs, err := lc.ld.load("", testTags, testEnv, patterns...)
		if err != nil {
			lc.err = err
			return
		}
		lc.pkgs = make(map[string]*packages.Package)
		for _, p := range pkgs {
			lc.pkgs[filepath.Base(p.PkgPath)] = p
		}
	})
	if lc.err != nil {
		t.Fatal(lc.err)
	}
	pkg := lc.pkgs[name]
	if pkg == nil {
		t.Fatalf("package testdata/%s was not loaded", name)
	}
	return lc.ld, pkg
}

// runCase runs generation on a golden case without writing anything: the outputs (by
// base name), the base names of the files it would delete, and the error report.
func runCase(t *testing.T, c goldenCase) (outputs map[string][]byte, removed []string, report string) {
	t.Helper()
	ld, pkg := loadCase(t, c.name)
	results, diags := plan(ld, []*packages.Package{pkg}, c.types, []string{"./testdata/" + c.name})
	var b strings.Builder
	for _, d := range diags {
		b.WriteString(d.format(caseDir(t, c.name)) + "\n")
	}
	outputs = make(map[string][]byte)
	if len(diags) == 0 {
		for _, r := range results {
			for _, f := range r.files {
				outputs[filepath.Base(f.path)] = f.src
			}
			for _, f := range r.stale {
				removed = append(removed, filepath.Base(f))
			}
		}
	}
	return outputs, removed, b.String()
}

// TestGolden compares what mwrpcgen generates for each case, or the errors it reports,
// with the golden files. With -update it rewrites them instead.
func TestGolden(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			dir := caseDir(t, c.name)
			outputs, removed, report := runCase(t, c)
			want := make(map[string][]byte) // golden file name → contents
			for name, src := range outputs {
				want[name+".golden"] = src
			}
			if report != "" {
				want["errors.golden"] = []byte(report)
			}
			if c.fails != (report != "") {
				t.Errorf("errors reported: %v; want %v\n%s", report != "", c.fails, report)
			}
			if !slices.Equal(removed, c.removed) {
				t.Errorf("removed %q; want %q", removed, c.removed)
			}

			existing, err := filepath.Glob(filepath.Join(dir, "*.golden"))
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				for _, f := range existing {
					if want[filepath.Base(f)] == nil {
						if err := os.Remove(f); err != nil {
							t.Fatal(err)
						}
					}
				}
				for name, src := range want {
					if err := os.WriteFile(filepath.Join(dir, name), src, 0o666); err != nil {
						t.Fatal(err)
					}
				}
				return
			}
			for _, f := range existing {
				if want[filepath.Base(f)] == nil {
					t.Errorf("%s: golden file of an output that is not generated (run go test -update)", f)
				}
			}
			names := make([]string, 0, len(want))
			for name := range want {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				golden, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Errorf("%v (run go test -update)", err)
					continue
				}
				if got := want[name]; !bytes.Equal(got, golden) {
					t.Errorf("%s/%s differs from what mwrpcgen generates (run go test -update):\n%s",
						c.name, name, lineDiff(golden, got))
				}
			}

			// A second run over the same package gives the same bytes.
			again, _, report2 := runCase(t, c)
			if report2 != report || len(again) != len(outputs) {
				t.Errorf("second run: different outputs or errors")
			}
			for name, src := range again {
				if !bytes.Equal(src, outputs[name]) {
					t.Errorf("second run: %s differs", name)
				}
			}
		})
	}
}

// lineDiff shows the first lines where got differs from want.
func lineDiff(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(wl), len(gl)) && shown < 10; i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + w + "\n  got:  " + g + "\n")
			shown++
		}
	}
	return b.String()
}

// validOverlay returns a go/packages overlay that puts the generated files of the valid
// golden cases in place (and removes the files they delete), with the case names.
func validOverlay(t *testing.T) (map[string][]byte, []string) {
	t.Helper()
	overlay := make(map[string][]byte)
	var names []string
	for _, c := range goldenCases {
		if c.fails {
			continue
		}
		names = append(names, c.name)
		dir := caseDir(t, c.name)
		outputs, removed, report := runCase(t, c)
		if report != "" {
			t.Fatalf("%s: %s", c.name, report)
		}
		for name, src := range outputs {
			overlay[filepath.Join(dir, name)] = src
		}
		_, pkg := loadCase(t, c.name)
		for _, name := range removed {
			overlay[filepath.Join(dir, name)] = []byte("package " + pkg.Name + "\n")
		}
	}
	return overlay, names
}

// TestGeneratedCodeCompiles builds each valid case with its generated files in place
// (the go command compiles them for export data; go/packages type-checks them).
func TestGeneratedCodeCompiles(t *testing.T) {
	overlay, names := validOverlay(t)
	cfg := &packages.Config{
		Mode:       packages.NeedName | packages.NeedTypes | packages.NeedSyntax | packages.NeedTypesInfo,
		BuildFlags: []string{"-tags=" + testTags},
		Env:        append(os.Environ(), testEnv...),
		Overlay:    overlay,
	}
	var patterns []string
	for _, n := range names {
		patterns = append(patterns, "./testdata/"+n)
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) != len(patterns) {
		t.Fatalf("loaded %d packages; want %d", len(pkgs), len(patterns))
	}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			t.Errorf("%s: %v", p.PkgPath, e)
		}
	}
}

// TestEndToEnd runs testdata/e2e, which calls every method of the pointer, value, raw
// and imports cases through the generated client and handler and the codecs.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a test binary")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	overlay, _ := validOverlay(t)
	tmp := t.TempDir()
	replace := make(map[string]string)
	i := 0
	for path, src := range overlay {
		i++
		f := filepath.Join(tmp, strconv.Itoa(i)+".go")
		if err := os.WriteFile(f, src, 0o666); err != nil {
			t.Fatal(err)
		}
		replace[path] = f
	}
	js, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayFile, js, 0o666); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goCmd, "test", "-count=1", "-overlay="+overlayFile, "./testdata/e2e")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test ./testdata/e2e: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestStaleStubFailsToBuild: after the interface gains a method, the stubs generated
// before fail to build with a message that names go generate.
func TestStaleStubFailsToBuild(t *testing.T) {
	dir := caseDir(t, "pointer")
	gen, err := os.ReadFile(filepath.Join(dir, "kv_mwrpc.go.golden"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(dir, "kv.go"))
	if err != nil {
		t.Fatal(err)
	}
	newer := strings.Replace(string(src), "type KV interface {\n", "type KV interface {\n\tPing(ctx context.Context, req *GetReq) (*GetResp, error)\n", 1)
	if newer == string(src) {
		t.Fatal("testdata/pointer/kv.go: no KV interface to add a method to")
	}
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedTypes | packages.NeedSyntax | packages.NeedTypesInfo,
		Env:  append(os.Environ(), testEnv...),
		Overlay: map[string][]byte{
			filepath.Join(dir, "kv.go"):       []byte(newer),
			filepath.Join(dir, "kv_mwrpc.go"): gen,
		},
	}
	pkgs, err := packages.Load(cfg, "./testdata/pointer")
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, p := range pkgs {
		for _, e := range p.Errors {
			msgs = append(msgs, e.Msg)
		}
	}
	joined := strings.Join(msgs, "\n")
	if !strings.Contains(joined, "_KV_stubs_are_stale_run_go_generate") || !strings.Contains(joined, "missing method Ping") {
		t.Fatalf("stale stubs: %q; want a build error naming _KV_stubs_are_stale_run_go_generate and the missing method", joined)
	}
}
