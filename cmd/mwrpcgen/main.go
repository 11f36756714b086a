// Command mwrpcgen writes the client stubs and server dispatch of mwrpc services.
//
// A service is a Go interface whose methods each have one of four forms, the RPC kinds
// of gRPC:
//
//	Get(ctx context.Context, req T) (R, error)                            // unary
//	Watch(ctx context.Context, req T) iter.Seq2[R, error]                 // server streaming
//	Upload(ctx context.Context, in iter.Seq2[T, error]) (R, error)        // client streaming
//	Chat(ctx context.Context, in iter.Seq2[T, error]) iter.Seq2[R, error] // bidirectional
//
// where T and R are each a pointer to a struct, a struct, []byte or a basic type (a
// boolean, an integer, a float or a string, or a named type with one of those underneath).
// Methods whose request and response are both []byte use the raw codec, so bulk data is
// never re-encoded (see package codec); a []byte stream message is never encoded either.
// The side that receives a stream ranges over it; the side that sends returns (or
// passes) an iterator whose yield blocks while the receiver's window is full and returns
// false once the stream is over, when the producer must return (rpc.Cause says why). An
// error ends a stream: a producer yields (zero, err); a receiver sees (zero, err) last.
// rpc.Slice turns a slice into a stream to send. See package rpc's streamiter.go and the
// README's Streams section.
//
// Usage:
//
//	mwrpcgen [-type KV,Other] [-tags tag,list] [-v] [packages]
//
// The packages default to ".". With -type, mwrpcgen generates code for the named
// interfaces; without it, for every interface whose doc comment holds the line
//
//	//mwrpc:service
//
// which may also name the service on the wire (by default "<package name>.<Interface>"),
// as a proto package does: "//mwrpc:service acme.kv.v1.KV".
//
// The usual way to run it is from a go:generate line in the package that declares the
// services, with mwrpcgen a tool dependency of the module (go get -tool
// github.com/mwrpc/mwrpc/cmd/mwrpcgen):
//
//	//go:generate go tool mwrpcgen -type KV
//
// For the services declared in kv.go, mwrpcgen writes kv_mwrpc.go next to it (copying
// kv.go's build constraints, including those implied by a _GOOS or _GOARCH file name
// suffix). For service KV the file declares
//
//	const KVServiceName = "<package name>.KV"   // or the marker's name
//	type KVClient struct{ ... }              // implements KV over an rpc.Invoker
//	func NewKVClient(cc rpc.Invoker) *KVClient
//	func (c *KVClient) WithCallOptions(opts ...rpc.CallOption) *KVClient
//	type UnimplementedKV struct{}            // every method answers Unimplemented
//	func RegisterKV(s *rpc.Server, impl KV)
//	var KVServiceDesc = rpc.ServiceDesc{...}
//
// and an unexported handler per method. The client's methods keep the interface's
// signatures, so it implements the interface; per-call options (rpc.WaitForReady,
// rpc.Header, rpc.Trailer) go through WithCallOptions, which returns a client whose
// every call passes them:
//
//	var trailer rpc.MD
//	reply, err := kv.WithCallOptions(rpc.WaitForReady(), rpc.Trailer(&trailer)).Get(ctx, req)
//
// A server type that embeds UnimplementedKV keeps building when methods are added to
// KV, and answers Unimplemented for those it does not implement, as gRPC's
// Unimplemented<Service>Server does. The output is gofmt'ed, deterministic, and
// stamped with the generator's version, so that `go generate ./... && git diff
// --exit-code` checks that the generated code is current. Files are rewritten only when
// their contents change.
//
// and a check that stops the build, with a message naming go generate, when the interface
// has methods the stubs lack.
//
// When a package's service has a method of the wrong shape, or a request or response
// field the msgpack codec cannot carry (a channel, a function, unsafe.Pointer, a complex
// number, an interface other than any: reported at the field, with its path), mwrpcgen
// reports every such problem, as file:line:col, writes nothing for that package, and exits
// with status 1. Unexported fields, which do not travel, get a warning. Generated files already in the package are ignored
// while loading it (they may be stale), and code that uses what is about to be generated
// (RegisterKV, NewKVClient) does not stop generation.
//
// Name all the services of a package in one run: each run rewrites the output files of
// the source files it finds services in. Without -type, mwrpcgen also deletes the
// generated files of a package that no longer hold any service (for example after a
// service moved to another file).
package main

import (
	"errors"
	"flag"
	"fmt"
	"go/token"
	"io"
	"os"
	"strings"
)

// version is written into every generated file. Bump it whenever the generated code
// changes, so that stale files show up as a diff.
const version = "v0.3.0"

func main() {
	dir, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mwrpcgen:", err)
		os.Exit(2)
	}
	os.Exit(run(dir, os.Args[1:], os.Stderr))
}

// run is the command: it parses args, generates code for the packages they name
// (relative to dir) and reports to stderr. It returns the exit status: 0 on success, 1
// when a package has errors, 2 for a usage error.
func run(dir string, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("mwrpcgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	typeList := fs.String("type", "", "comma-separated `names` of the service interfaces (default: those marked //mwrpc:service)")
	tags := fs.String("tags", "", "comma-separated build `tags` to load the packages with")
	verbose := fs.Bool("v", false, "report what is written")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: mwrpcgen [-type KV,Other] [-tags tag,list] [-v] [packages]\n\n")
		fmt.Fprintf(stderr, "mwrpcgen %s writes <file>_mwrpc.go, the client and server stubs of the mwrpc\n", version)
		fmt.Fprintf(stderr, "services declared in <file>.go. Packages default to \".\".\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	opts := options{dir: dir, tags: *tags, warn: stderr}
	if *verbose {
		opts.log = stderr
	}
	if isSet(fs, "type") {
		names, err := parseTypeList(*typeList)
		if err != nil {
			fmt.Fprintf(stderr, "mwrpcgen: %v\n", err)
			return 2
		}
		opts.types = names
	}
	patterns := fs.Args()
	if len(patterns) == 0 {
		patterns = []string{"."}
	}

	diags, err := generate(opts, patterns)
	if err != nil {
		fmt.Fprintf(stderr, "mwrpcgen: %v\n", err)
		return 1
	}
	if len(diags) > 0 {
		for _, d := range diags {
			fmt.Fprintln(stderr, d.format(dir))
		}
		return 1
	}
	return 0
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// parseTypeList splits the -type value into interface names.
func parseTypeList(s string) ([]string, error) {
	var names []string
	seen := make(map[string]bool)
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !token.IsIdentifier(name) {
			return nil, fmt.Errorf("-type: %q is not a Go identifier", name)
		}
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, errors.New("-type: no interface names given")
	}
	return names, nil
}
