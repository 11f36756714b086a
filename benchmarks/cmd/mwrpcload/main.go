// Command mwrpcload drives mwrpc under faults and over long runs: a server, a bounded
// caller that checks every response against its call and says how each call ended, and a
// soak that runs many callers as processes, kills and restarts them, and samples the
// server's memory and goroutines. scripts/faults/ runs the fault suite with it inside the
// rxe VM (make test-faults); make soak runs the soak on loopback.
//
//	mwrpcload serve -listen 127.0.0.1:7000
//	mwrpcload call -target 127.0.0.1:7000 -duration 10s -deadline 2s -sizes 64,64KiB,1MiB -callers 4
//	mwrpcload stats -target 127.0.0.1:7000
//	mwrpcload soak -calls 1000000 -clients 8 -out results/soak
//	mwrpcload faults -fabric soft   # as root, inside the rxe VM only (make test-faults)
//
// call stops by itself after -duration (every call then ends within its deadline, or is
// counted as hung), prints one JSON summary on stdout and exits 0; a line "heal" on its
// stdin tells it the fault has healed (it reports how long until the next call succeeded).
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mwrpcload serve|call|stats|soak|faults [flags] (-h for each)")
		os.Exit(2)
	}
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "serve":
		err = serve(args)
	case "call":
		err = call(args)
	case "stats":
		err = stats(args)
	case "soak":
		err = soak(args)
	case "faults":
		err = faultsCmd(args)
	default:
		err = fmt.Errorf("unknown command %q: want serve, call, stats, soak or faults", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mwrpcload:", err)
		os.Exit(1)
	}
}
