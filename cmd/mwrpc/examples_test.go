package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/examples/files/filesservice"
)

// These tests run examples/kv and examples/files as servers in processes of their own and
// the command against them, as a user would.

var builds sync.Map // package path -> *buildResult

type buildResult struct {
	once sync.Once
	bin  string
	err  error
}

// build compiles the example package pkg ("../../examples/kv") once per test run.
func build(t *testing.T, pkg string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, new(buildResult))
	b := v.(*buildResult)
	b.once.Do(func() {
		b.bin = filepath.Join(buildDir, filepath.Base(pkg))
		out, err := exec.Command("go", "build", "-o", b.bin, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// serveExample starts the example with -serve on a loopback port and args, and returns
// the address it says it serves on. The server is interrupted (and must exit cleanly) at
// the test's end.
func serveExample(t *testing.T, pkg, service string, args ...string) string {
	t.Helper()
	bin := build(t, pkg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, bin, append([]string{"-serve", "127.0.0.1:0"}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	var mu sync.Mutex
	sc := bufio.NewScanner(stderr)
	addr := ""
	re := regexp.MustCompile(`serving ` + regexp.QuoteMeta(service) + ` on (\S+)`)
	for addr == "" && sc.Scan() {
		logs.WriteString(sc.Text() + "\n")
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		cancel()
		_ = cmd.Wait()
		t.Fatalf("%s never said where it serves:\n%s", pkg, logs.String())
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for sc.Scan() {
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		defer cancel()
		_ = cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		<-drained
		if err != nil {
			t.Errorf("%s: %v\n%s", pkg, err, logs.String())
		}
	})
	return addr
}

func TestKVExample(t *testing.T) {
	addr := serveExample(t, "../../examples/kv", "kvservice.KV")
	steps := []struct {
		args      []string
		code      int
		out, errs string // out exact, errs contained
	}{
		{[]string{"list", addr}, 0, "kvservice.KV\nmwrpc.reflection.v1.Reflection\n", ""},
		{[]string{"list", addr, "kvservice.KV"}, 0, "kvservice.KV/Delete\nkvservice.KV/Get\nkvservice.KV/Put\n", ""},
		{[]string{"describe", addr, "kvservice.KV/Put"}, 0, "kvservice.KV/Put: unary (msgpack)\n  request  *kvservice.PutRequest\n  response *kvservice.PutResponse\n\n" +
			"kvservice.PutRequest struct {\n  Key string\n  Value []byte\n}\n\nkvservice.PutResponse struct {\n  Version int64\n}\n", ""},
		{[]string{"call", addr, "kvservice.KV/Put", `{"Key":"k","Value":"aGVsbG8="}`}, 0, "{\n  \"Version\": 1\n}\n", ""},
		{[]string{"call", "-timeout", "5s", "-H", "x-caller: test", addr, "kvservice.KV/Get", `{"Key":"k"}`}, 0, "{\n  \"Value\": \"aGVsbG8=\",\n  \"Version\": 1\n}\n", ""},
		{[]string{"call", addr, "kvservice.KV/Get", `{"Key":"missing"}`}, 1, "", "code = NotFound"},
		{[]string{"call", addr, "/kvservice.KV/Delete", `{"Key":"k"}`}, 0, "{\n  \"Existed\": true\n}\n", ""},
	}
	for _, s := range steps {
		code, out, errs := mwrpc(t, "", s.args...)
		if code != s.code || out != s.out || !strings.Contains(errs, s.errs) {
			t.Errorf("mwrpc %s: exit %d\n%s%s\nwant exit %d\n%s%s", strings.Join(s.args, " "), code, out, errs, s.code, s.out, s.errs)
		}
	}
}

func TestKVExampleTLS(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl is missing: apt-get install -y openssl (examples/kv/mkcerts.sh uses it)")
	}
	dir := t.TempDir()
	if out, err := exec.Command("../../examples/kv/mkcerts.sh", dir).CombinedOutput(); err != nil {
		t.Fatalf("mkcerts.sh: %v\n%s", err, out)
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	addr := serveExample(t, "../../examples/kv", "kvservice.KV", "-tls-cert", f("server.pem"), "-tls-key", f("server.key"), "-tls-ca", f("ca.pem"))
	tlsFlags := []string{"-tls-ca", f("ca.pem"), "-tls-cert", f("client.pem"), "-tls-key", f("client.key")}
	code, out, errs := mwrpc(t, "", append(append([]string{"call"}, tlsFlags...), addr, "kvservice.KV/Put", `{"Key":"a","Value":""}`)...)
	if code != 0 || out != "{\n  \"Version\": 1\n}\n" {
		t.Errorf("call with TLS: exit %d %q %s", code, out, errs)
	}
	if code, out, errs := mwrpc(t, "", append(append([]string{"list"}, tlsFlags...), addr)...); code != 0 || !strings.Contains(out, "kvservice.KV\n") {
		t.Errorf("list with TLS: exit %d %q %s", code, out, errs)
	}
	code, _, errs = mwrpc(t, "", "list", "-connect-timeout", "5s", addr)
	if code != 1 || !strings.Contains(errs, "the server requires TLS") {
		t.Errorf("list without TLS: exit %d %s; want it refused saying the server requires TLS", code, errs)
	}
	code, _, errs = mwrpc(t, "", "list", "-connect-timeout", "5s", "-tls-ca", f("ca.pem"), addr)
	if code != 1 || !strings.Contains(errs, "certificate required") {
		t.Errorf("list without a client certificate: exit %d %s", code, errs)
	}
}

func TestFilesExample(t *testing.T) {
	addr := serveExample(t, "../../examples/files", "filesservice.Files")
	code, out, errs := mwrpc(t, "", "describe", addr, "filesservice.Files")
	for _, want := range []string{
		"filesservice.Files/Download: server streaming (msgpack, []byte messages raw)\n  request  *filesservice.DownloadRequest\n  response stream of []byte\n",
		"filesservice.Files/Echo: bidirectional streaming (msgpack)\n  request  stream of *filesservice.Message\n  response stream of *filesservice.Message\n",
		"filesservice.Files/Upload: client streaming (msgpack, []byte messages raw)\n  request  stream of []byte\n  response *filesservice.Summary\n",
		"filesservice.DownloadRequest struct {\n  Size int64\n  ChunkSize int\n  Seed uint64\n}\n",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("describe: exit %d %s; lacks %q:\n%s", code, errs, want, out)
		}
	}

	// Download: one JSON line per chunk, base64; together the content Seed names.
	code, out, errs = mwrpc(t, "", "call", addr, "filesservice.Files/Download", `{"Size":10,"ChunkSize":4,"Seed":3}`)
	want := make([]byte, 10)
	filesservice.NewContent(3).Read(want)
	var lines []string
	for i := 0; i < len(want); i += 4 {
		lines = append(lines, `"`+base64.StdEncoding.EncodeToString(want[i:min(i+4, len(want))])+`"`)
	}
	if code != 0 || out != strings.Join(lines, "\n")+"\n" {
		t.Errorf("Download: exit %d %s\n%s\nwant\n%s", code, errs, out, strings.Join(lines, "\n"))
	}

	// Upload: chunks as JSON lines on standard input; the summary back.
	in := `"aGVs"` + "\n" + `"bG8="` + "\n"
	code, out, errs = mwrpc(t, in, "call", addr, "filesservice.Files/Upload")
	sum := sha256.Sum256([]byte("hello"))
	wantSum := fmt.Sprintf("{\"Bytes\":5,\"SHA256\":%q}\n", base64.StdEncoding.EncodeToString(sum[:]))
	if code != 0 || out != wantSum {
		t.Errorf("Upload: exit %d %s\n%q\nwant %q", code, errs, out, wantSum)
	}

	// Echo: messages in, the same messages out; an empty one ends it with its status.
	in = `{"Seq":1,"Text":"one"}` + "\n" + `{"Seq":2,"Text":"two"}` + "\n"
	code, out, errs = mwrpc(t, in, "call", addr, "filesservice.Files/Echo", "-")
	if code != 0 || out != `{"Seq":1,"Text":"one"}`+"\n"+`{"Seq":2,"Text":"two"}`+"\n" {
		t.Errorf("Echo: exit %d %s\n%s", code, errs, out)
	}
	code, out, errs = mwrpc(t, `{"Seq":1,"Text":"one"} {"Seq":2}`, "call", addr, "filesservice.Files/Echo")
	if code != 1 || out != `{"Seq":1,"Text":"one"}`+"\n" || !strings.Contains(errs, "code = InvalidArgument desc = message 2 is empty") {
		t.Errorf("Echo ended by the server: exit %d %s\n%s", code, errs, out)
	}
	code, _, errs = mwrpc(t, `{"Seq":"x"}`, "call", addr, "filesservice.Files/Echo")
	if code != 1 || !strings.Contains(errs, "message 1 of /filesservice.Files/Echo: Seq: want a number for int, got a string") {
		t.Errorf("Echo with a bad message: exit %d %s", code, errs)
	}
}

// buildDir holds the example binaries (TestMain makes and removes it).
var buildDir string
