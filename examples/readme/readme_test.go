//go:build readme

// Package readme tests the README's "Your own service in a new module" as a new user
// would follow it: a module made from scratch in a temporary directory, the README's
// commands and files as written, then the client and the server as two processes, the
// client first. `make test-readme` (a step of `make test`) runs it; it needs the go
// command and the Go module proxy (the new module's dependencies are downloaded), which is
// why it sits behind the build tag readme rather than in `go test ./...`.
package readme

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// files returns the README's files: each fenced block that follows a
// "<!-- file: PATH -->" line.
func files(t *testing.T, readme []byte) map[string]string {
	t.Helper()
	out := map[string]string{}
	marker := regexp.MustCompile(`^<!-- file: (\S+) -->$`)
	sc := bufio.NewScanner(bytes.NewReader(readme))
	var path string
	var body []string
	inBlock := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case inBlock && line == "```":
			out[path], path, inBlock = strings.Join(body, "\n")+"\n", "", false
		case inBlock:
			body = append(body, line)
		case path != "" && strings.HasPrefix(line, "```"):
			inBlock, body = true, nil
		default:
			if m := marker.FindStringSubmatch(line); m != nil {
				path = m[1]
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("the README has no <!-- file: ... --> blocks")
	}
	return out
}

// localRecipe returns the README's go mod edit line for a checkout, with root as the
// checkout's path.
func localRecipe(t *testing.T, readme []byte, root string) []string {
	t.Helper()
	for _, line := range strings.Split(string(readme), "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "go mod edit -require=github.com/mwrpc/mwrpc@") {
			return strings.Fields(strings.ReplaceAll(line, "=../mwrpc", "="+root))
		}
	}
	t.Fatal("the README has no go mod edit line for a checkout")
	return nil
}

func TestNewModule(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	run := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The README's commands, with its recipe for a checkout in place of go get -tool
	// (the module is not published): this checkout stands in for ../mwrpc.
	run("go", "mod", "init", "example.com/hello")
	run(localRecipe(t, readme, root)...)
	for path, body := range files(t, readme) {
		body = strings.ReplaceAll(body, "127.0.0.1:7000", addr)
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, path), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run("go", "mod", "tidy")
	run("go", "generate", "./...")
	if _, err := os.Stat(filepath.Join(dir, "greeter", "greeter_mwrpc.go")); err != nil {
		t.Fatalf("go generate wrote no stubs: %v", err)
	}
	run("go", "build", "-o", "bin/", "./client", "./server")

	// The client first: Dial waits for the server.
	client := exec.CommandContext(ctx, filepath.Join(dir, "bin", "client"))
	var out bytes.Buffer
	client.Stdout, client.Stderr = &out, &out
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	defer client.Process.Kill()
	time.Sleep(500 * time.Millisecond)
	server := exec.CommandContext(ctx, filepath.Join(dir, "bin", "server"))
	var serverOut bytes.Buffer
	server.Stdout, server.Stderr = &serverOut, &serverOut
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	if err := client.Wait(); err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, out.String(), serverOut.String())
	}
	if got := strings.TrimSpace(out.String()); got != "hello, world" {
		t.Fatalf("client printed %q, want %q", got, "hello, world")
	}
}
