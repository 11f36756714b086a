package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRunBoth runs the example as `go run ./examples/files` does, smaller, and checks what
// it says.
func TestRunBoth(t *testing.T) {
	var out strings.Builder
	if err := runBoth(&out, config{size: 64 << 20, chunk: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"download: 64 MiB", "upload: 64 MiB", "SHA-256 matches", "echo: 100 messages came back in order", "64 chunks fetched with RDMA READ"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestTwoProcesses runs the example as a server and a client in two processes, as
// -serve and -connect do.
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the example")
	}
	bin := filepath.Join(t.TempDir(), "files")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	server := exec.CommandContext(ctx, bin, "-serve", "127.0.0.1:0")
	logs, err := server.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = server.Process.Signal(os.Interrupt) // GracefulStop
		_ = server.Wait()
	}()
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`serving filesservice.Files on (\S+)`)
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	var a string
	select {
	case a = <-addr:
	case <-time.After(time.Minute):
		t.Fatal("the server did not say where it serves")
	}
	out, err := exec.CommandContext(ctx, bin, "-connect", a, "-size", "128MiB", "-chunk", "2MiB").CombinedOutput()
	t.Logf("client:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"download: 128 MiB in 2048 KiB chunks", "upload: 128 MiB", "SHA-256 matches", "echo: 100 messages"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("client output lacks %q", want)
		}
	}
}
