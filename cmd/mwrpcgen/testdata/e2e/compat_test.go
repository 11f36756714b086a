package e2e

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mwrpc/mwrpc/rpc"

	"github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/pointer"
	stream "github.com/mwrpc/mwrpc/cmd/mwrpcgen/testdata/stream"
)

// oldKV is a server written when KV had only Get: embedding UnimplementedKV, it still
// builds now that KV also has Put, Delete and Scan, which answer Unimplemented.
type oldKV struct{ pointer.UnimplementedKV }

func (oldKV) Get(ctx context.Context, req *pointer.GetReq) (*pointer.GetResp, error) {
	_ = rpc.SetTrailer(ctx, rpc.Pairs("seen", req.Key))
	return &pointer.GetResp{Found: true}, nil
}

// oldFiles is a server written when Files had only Stat.
type oldFiles struct{ stream.UnimplementedFiles }

func (oldFiles) Stat(ctx context.Context, req *stream.StatRequest) (*stream.StatReply, error) {
	return &stream.StatReply{Size: 1}, nil
}

// unimplemented checks that err is the Unimplemented status that names method.
func unimplemented(t *testing.T, what string, err error, method string) {
	t.Helper()
	if !errors.Is(err, rpc.ErrUnimplemented) || !strings.Contains(err.Error(), "method "+method+" is not implemented") {
		t.Errorf("%s: %v; want Unimplemented naming %s", what, err, method)
	}
}

func TestOlderServerAnswersUnimplemented(t *testing.T) {
	for name, conn := range conns(t, &pointer.KVServiceDesc, oldKV{}, nil) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cl := pointer.NewKVClient(conn)
			if got, err := cl.Get(ctx, &pointer.GetReq{Key: "a"}); err != nil || !got.Found {
				t.Errorf("Get = %+v, %v", got, err)
			}
			_, err := cl.Put(ctx, &pointer.PutReq{Key: "k"})
			unimplemented(t, "Put", err, "Put of pointer.KV")
			_, err = cl.Scan(ctx, &pointer.ScanReq{})
			unimplemented(t, "Scan", err, "Scan of pointer.KV")
		})
	}

	client := serve(t, func(s *rpc.Server) { stream.RegisterFiles(s, oldFiles{}) })
	ctx := context.Background()
	files := stream.NewFilesClient(client)
	if r, err := files.Stat(ctx, &stream.StatRequest{}); err != nil || r.Size != 1 {
		t.Errorf("Stat: %+v %v", r, err)
	}
	for _, err := range files.Download(ctx, &stream.StatRequest{}) {
		unimplemented(t, "Download", err, "Download of files.Files")
	}
	_, err := files.Upload(ctx, seq(&stream.Chunk{}))
	unimplemented(t, "Upload", err, "Upload of files.Files")
	for _, err := range files.Echo(ctx, seq(stream.Chunk{})) {
		unimplemented(t, "Echo", err, "Echo of files.Files")
	}
}

// serve serves what register registers on a loopback port and returns a client of it.
func serve(t *testing.T, register func(*rpc.Server)) *rpc.Client {
	t.Helper()
	srv := rpc.NewServer()
	register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// TestCallOptions: options given to a generated client's WithCallOptions reach every
// call, unary and streaming, and leave the client they came from as it was.
func TestCallOptions(t *testing.T) {
	// WaitForReady: a call made before the server is up waits for it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	client, err := rpc.NewClient(addr, rpc.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	plain := pointer.NewKVClient(client)
	if _, err := plain.Get(ctx, &pointer.GetReq{}); !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("Get with no server and no WaitForReady: %v; want Unavailable at once", err)
	}
	var trailer rpc.MD
	waiting := plain.WithCallOptions(rpc.WaitForReady()).WithCallOptions(rpc.Trailer(&trailer))
	srv := rpc.NewServer()
	pointer.RegisterKV(srv, oldKV{})
	done := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			done <- err
			return
		}
		done <- srv.Serve(ln)
	}()
	defer func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	if got, err := waiting.Get(ctx, &pointer.GetReq{Key: "waited"}); err != nil || !got.Found {
		t.Fatalf("Get with WaitForReady: %+v, %v", got, err)
	}
	if v := trailer["seen"]; len(v) != 1 || v[0] != "waited" {
		t.Errorf("trailer through WithCallOptions: %v", trailer)
	}
	trailer = nil
	if _, err := plain.Get(ctx, &pointer.GetReq{Key: "plain"}); err != nil || trailer != nil {
		t.Errorf("the client WithCallOptions came from: %v, trailer %v; want its calls without the options", err, trailer)
	}
}
