package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// grpcStreamDesc describes grpc in the streaming cell.
const grpcStreamDesc = "gRPC-Go streams over one loopback HTTP/2 connection, hand-written ServiceDesc with a server-streaming and a client-streaming method, raw-bytes codec (no protobuf), default flow control (BDP-sized windows)"

// grpcBulkDesc is what protoc-gen-go-grpc would write for a service Bulk with a
// server-streaming method Download (a bulkRequest in, chunks out) and a client-streaming
// method Upload (chunks in, a bulkReply out), by hand.
var grpcBulkDesc = grpc.ServiceDesc{
	ServiceName: "bench.Bulk",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{
		{StreamName: "Download", Handler: grpcDownload, ServerStreams: true},
		{StreamName: "Upload", Handler: grpcUpload, ClientStreams: true},
	},
	Metadata: "mwrpcbench",
}

const (
	grpcDownloadMethod = "/bench.Bulk/Download"
	grpcUploadMethod   = "/bench.Bulk/Upload"
)

// grpcDownload sends the bytes a bulkRequest asks for, chunk by chunk, all from one
// buffer of the pattern.
func grpcDownload(_ any, stream grpc.ServerStream) error {
	var req []byte
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	total, chunk, err := parseBulkRequest(req)
	if err != nil {
		return err
	}
	buf := payload(chunk)
	for sent := int64(0); sent < total; {
		n := chunkLen(total, sent, chunk)
		if err := stream.SendMsg(buf[:n]); err != nil {
			return err
		}
		sent += int64(n)
	}
	return nil
}

// grpcUpload reads chunks to the end of the client's stream, checks each, and answers with
// the count of bytes read.
func grpcUpload(_ any, stream grpc.ServerStream) error {
	var got int64
	for {
		var p []byte
		err := stream.RecvMsg(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := checkChunk("grpc", p, len(p)); err != nil {
			return err
		}
		got += int64(len(p))
	}
	return stream.SendMsg(bulkReply(got))
}

func serveGRPCStream(ln net.Listener) (Server, error) {
	g := &grpcServer{served: make(chan error, 1)}
	g.srv = grpc.NewServer(grpc.MaxRecvMsgSize(grpcMaxMessage), grpc.MaxSendMsgSize(grpcMaxMessage))
	g.srv.RegisterService(&grpcBulkDesc, struct{}{})
	go func() { g.served <- g.srv.Serve(ln) }()
	return g, nil
}

// grpcBulkClient is one grpc.ClientConn (one HTTP/2 connection), a stream per transfer.
type grpcBulkClient struct {
	conn *grpc.ClientConn
	buf  []byte
}

func dialGRPCStream(addr string) (StreamInstance, error) {
	g := &grpcBulkClient{}
	var err error
	g.conn, err = grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(rawCodecName),
			grpc.MaxCallRecvMsgSize(grpcMaxMessage), grpc.MaxCallSendMsgSize(grpcMaxMessage)))
	if err != nil {
		return nil, fmt.Errorf("grpc.NewClient: %w", err)
	}
	// One small download now, so that the connection is up before anything is measured.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err = g.download(ctx, 1, 1, grpc.WaitForReady(true))
	cancel()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("first stream: %w", err), g.conn.Close())
	}
	return g, nil
}

func (g *grpcBulkClient) Download(ctx context.Context, total int64, chunk int) error {
	return g.download(ctx, total, chunk)
}

func (g *grpcBulkClient) download(ctx context.Context, total int64, chunk int, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithCancel(ctx) // ends the stream on an early return
	defer cancel()
	cs, err := g.conn.NewStream(ctx, &grpcBulkDesc.Streams[0], grpcDownloadMethod, opts...)
	if err != nil {
		return err
	}
	if err := cs.SendMsg(bulkRequest(total, chunk)); err != nil {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	for got := int64(0); got < total; {
		var p []byte
		if err := cs.RecvMsg(&p); err != nil {
			return fmt.Errorf("grpc: receive at %d of %d: %w", got, total, err)
		}
		n := chunkLen(total, got, chunk)
		if err := checkChunk("grpc", p, n); err != nil {
			return err
		}
		got += int64(n)
	}
	var p []byte
	if err := cs.RecvMsg(&p); !errors.Is(err, io.EOF) {
		return fmt.Errorf("grpc: after the last chunk: %v, want io.EOF", err)
	}
	return nil
}

func (g *grpcBulkClient) Upload(ctx context.Context, total int64, chunk int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(g.buf) != chunk {
		g.buf = payload(chunk)
	}
	cs, err := g.conn.NewStream(ctx, &grpcBulkDesc.Streams[1], grpcUploadMethod)
	if err != nil {
		return err
	}
	for sent := int64(0); sent < total; {
		n := chunkLen(total, sent, chunk)
		if err := cs.SendMsg(g.buf[:n]); err != nil {
			return fmt.Errorf("grpc: send at %d of %d: %w", sent, total, err)
		}
		sent += int64(n)
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	var reply []byte
	if err := cs.RecvMsg(&reply); err != nil {
		return fmt.Errorf("grpc: upload's answer: %w", err)
	}
	return checkBulkReply("grpc", reply, total)
}

func (g *grpcBulkClient) Close() error { return g.conn.Close() }
