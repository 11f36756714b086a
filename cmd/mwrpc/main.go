// Command mwrpc lists, describes and calls the services of a running mwrpc server, as
// grpcurl does for gRPC. The server must have the reflection service (package
// rpc/reflection: reflection.Register(srv)).
//
// Usage:
//
//	mwrpc list     [flags] ADDR                       the server's services
//	mwrpc list     [flags] ADDR SERVICE               a service's methods
//	mwrpc describe [flags] ADDR SERVICE[/METHOD]      methods, stream kinds, message fields
//	mwrpc call     [flags] ADDR SERVICE/METHOD [JSON] call a method with JSON
//
// A call's request is JSON, converted through the types the server reflects (numbers
// checked against their Go types, []byte as base64, time.Time in RFC 3339); an unknown
// field is an error that names the fields there are. Without JSON, a unary or
// server-streaming call sends {} and a client- or bidirectional-streaming call reads its
// messages from standard input; "-" reads standard input for any call. A stream's
// messages are JSON values one after another (JSON lines), in and out; a unary response
// is printed indented. A failed call prints its status (and its details, as JSON) to
// standard error and exits with status 1; a mistake in the command line exits with status 2.
//
// Flags (before or after the arguments):
//
//	-H 'key: value'   request metadata (repeatable)
//	-timeout 10s      the call's deadline (default 30s; 0: none)
//	-connect-timeout  how long to wait for the connection (default 10s)
//	-tls-ca FILE      use TLS, trusting servers signed by this CA (PEM)
//	-tls-cert FILE    with -tls-key: a client certificate for mutual TLS
//	-tls              use TLS with the system's roots
//	-v                print response headers and trailers to standard error
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/mwrpc/mwrpc/rpc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks a mistake in the command line (exit status 2).
var errUsage = errors.New("usage")

// run runs the command with args and returns its exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, o := args[0], newOptions(stderr)
	pos, err := o.parse(args[1:])
	if err == nil {
		switch cmd {
		case "list":
			err = o.list(ctx, pos, stdout)
		case "describe":
			err = o.describe(ctx, pos, stdout)
		case "call":
			err = o.call(ctx, pos, stdin, stdout)
		case "help", "-h", "-help", "--help":
			fmt.Fprint(stdout, usage)
			o.flags.SetOutput(stdout)
			o.flags.PrintDefaults()
			return 0
		default:
			err = fmt.Errorf("%w: unknown command %q (list, describe, call)", errUsage, cmd)
		}
	}
	if err == nil {
		return 0
	}
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "mwrpc: %v\n%s", strings.TrimPrefix(err.Error(), "usage: "), usage)
		return 2
	}
	fmt.Fprintf(stderr, "mwrpc: %v\n", err)
	printDetails(stderr, err)
	return 1
}

// printDetails prints the details a failed call's status carries, one JSON line each
// after its type.
func printDetails(w io.Writer, err error) {
	var st *rpc.Status
	if !errors.As(err, &st) {
		return
	}
	for _, d := range st.Details() {
		j, jerr := json.Marshal(d)
		if jerr != nil {
			j = []byte(fmt.Sprintf("%q", jerr.Error()))
		}
		fmt.Fprintf(w, "  detail %T: %s\n", d, j)
	}
}

const usage = `usage:
  mwrpc list     [flags] ADDR [SERVICE]
  mwrpc describe [flags] ADDR SERVICE[/METHOD]
  mwrpc call     [flags] ADDR SERVICE/METHOD [JSON | -]
  mwrpc help     (the flags)
`

// parse reads flags and positional arguments in any order.
func (o *options) parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := o.flags.Parse(args); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		args = o.flags.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}
