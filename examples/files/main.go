// Command files is mwrpc's streaming example: a service whose methods are streams
// (filesservice.Files), moving a gigabyte each way through memory windows, chunk by chunk,
// and checking the SHA-256 of what arrived.
//
//	go run ./examples/files                             # server and client in one process
//	go run ./examples/files -serve 127.0.0.1:7001       # a server
//	go run ./examples/files -connect 127.0.0.1:7001     # a client of it
//	go run ./examples/files -size 256MiB -chunk 4MiB    # other sizes
//
// Download is server streaming: the client asks for -size bytes and the server sends them
// in -chunk chunks; each one above the eager threshold is exposed in a memory window of its
// own, READ by the client and revoked at once, several in flight. Upload is client
// streaming, the other way. Echo is bidirectional.
package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"iter"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/mwrpc/mwrpc/examples/files/filesservice"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/rpc/reflection"
)

func main() {
	serve := flag.String("serve", "", "only serve on this address")
	connect := flag.String("connect", "", "only run the client against this address")
	sizeFlag := flag.String("size", "1GiB", "bytes to move each way (KiB, MiB, GiB suffixes)")
	chunkFlag := flag.String("chunk", "1MiB", "chunk size")
	flag.Parse()
	size, err := parseSize(*sizeFlag)
	if err == nil {
		var chunk int64
		if chunk, err = parseSize(*chunkFlag); err == nil {
			cfg := config{size: size, chunk: int(chunk)}
			switch {
			case *serve != "":
				err = runServer(*serve)
			case *connect != "":
				err = runClient(context.Background(), os.Stdout, *connect, cfg)
			default:
				err = runBoth(os.Stdout, cfg)
			}
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

type config struct {
	size  int64
	chunk int
}

// parseSize reads "1GiB", "64MiB", "4096".
func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > 1<<40/mult {
		return 0, fmt.Errorf("size %q: want a positive number of bytes, with an optional KiB, MiB or GiB", s)
	}
	return n * mult, nil
}

// runBoth serves on a loopback port and runs the client against it.
func runBoth(out io.Writer, cfg config) error {
	srv := rpc.NewServer()
	filesservice.RegisterFiles(srv, filesservice.Server{})
	reflection.Register(srv) // mwrpc list/describe/call (cmd/mwrpc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go srv.Serve(ln)
	defer srv.GracefulStop()
	fmt.Fprintf(out, "server: serving filesservice.Files on %s\n", ln.Addr())
	return runClient(context.Background(), out, ln.Addr().String(), cfg)
}

// runServer serves until interrupted.
func runServer(addr string) error {
	srv := rpc.NewServer()
	filesservice.RegisterFiles(srv, filesservice.Server{})
	reflection.Register(srv) // mwrpc list/describe/call (cmd/mwrpc)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	go func() { <-sig; srv.GracefulStop() }()
	log.Printf("serving filesservice.Files on %s", ln.Addr())
	return srv.Serve(ln)
}

// runClient downloads and uploads cfg.size bytes, checking both SHA-256s, then echoes a
// few messages.
func runClient(ctx context.Context, out io.Writer, addr string, cfg config) error {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second) // the server may still be starting
	cc, err := rpc.Dial(dctx, addr)
	cancel()
	if err != nil {
		return err
	}
	defer cc.Close()
	files := filesservice.NewFilesClient(cc)
	const seed = 42
	want := filesservice.Digest(seed, cfg.size) // what both directions must deliver

	// Download: server streaming.
	start := time.Now()
	h := sha256.New()
	var got int64
	for chunk, err := range files.Download(ctx, &filesservice.DownloadRequest{Size: cfg.size, ChunkSize: cfg.chunk, Seed: seed}) {
		if err != nil {
			return fmt.Errorf("download: %w", err)
		}
		h.Write(chunk) // chunk aliases registered memory until the next iteration
		got += int64(len(chunk))
	}
	if got != cfg.size {
		return fmt.Errorf("download: %d bytes arrived, want %d", got, cfg.size)
	}
	if err := filesservice.CheckDigest("download", h.Sum(nil), want); err != nil {
		return err
	}
	report(out, "download", cfg, time.Since(start))

	// Upload: client streaming.
	start = time.Now()
	sum, err := files.Upload(ctx, chunks(cfg, seed))
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if sum.Bytes != cfg.size {
		return fmt.Errorf("upload: the server got %d bytes, want %d", sum.Bytes, cfg.size)
	}
	if err := filesservice.CheckDigest("upload", sum.SHA256, want); err != nil {
		return err
	}
	report(out, "upload", cfg, time.Since(start))

	// Echo: bidirectional.
	const n = 100
	send := func(yield func(*filesservice.Message, error) bool) {
		for i := range n {
			if !yield(&filesservice.Message{Seq: i, Text: "ping " + strconv.Itoa(i)}, nil) {
				return
			}
		}
	}
	i := 0
	for m, err := range files.Echo(ctx, send) {
		if err != nil {
			return fmt.Errorf("echo: %w", err)
		}
		if m.Seq != i || m.Text != "ping "+strconv.Itoa(i) {
			return fmt.Errorf("echo: message %d came back as %d %q", i, m.Seq, m.Text)
		}
		i++
	}
	if i != n {
		return fmt.Errorf("echo: %d of %d messages came back", i, n)
	}
	fmt.Fprintf(out, "echo: %d messages came back in order\n", n)
	st := cc.Stats()
	fmt.Fprintf(out, "client: %d chunks fetched with RDMA READ (%d MiB), %d windows of its own bound\n", st.Reads, st.ReadBytes>>20, st.WindowsBound)
	return nil
}

// chunks yields the upload: cfg.size bytes of Content(seed), reusing one buffer (the
// stream has sent a chunk by the time yield returns).
func chunks(cfg config, seed uint64) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		c := filesservice.NewContent(seed)
		buf := make([]byte, cfg.chunk)
		for left := cfg.size; left > 0; {
			n := int(min(left, int64(len(buf))))
			c.Read(buf[:n])
			if !yield(buf[:n], nil) {
				return
			}
			left -= int64(n)
		}
	}
}

func report(out io.Writer, what string, cfg config, d time.Duration) {
	fmt.Fprintf(out, "%s: %d MiB in %d KiB chunks in %v: %.0f MB/s, SHA-256 matches\n",
		what, cfg.size>>20, cfg.chunk>>10, d.Round(time.Millisecond), float64(cfg.size)/d.Seconds()/1e6)
}
