package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/mwrpc/mwrpc/codec"
	"github.com/mwrpc/mwrpc/rpc"
	"github.com/mwrpc/mwrpc/transport"
	"github.com/mwrpc/mwrpc/transport/verbs/soft"
)

// mwrpcStreamDesc describes mwrpc-tcp in the streaming cell.
const mwrpcStreamDesc = "mwrpc streams (rpc.NewStream; a hand-written rpc.ServiceDesc with a server-streaming and a client-streaming method, raw codec, SendBytes/RecvBytes) over the soft provider's TCP fabric (loopback), one connection, the default stream window (4 MiB)"

// mwrpcStream16MDesc describes mwrpc-stream16M, in the streaming cell only.
const mwrpcStream16MDesc = "mwrpc-tcp's streams with a 16 MiB stream window on both sides (transport.Config.StreamWindow)"

// mwrpcStream16M is the transport configuration of mwrpc-stream16M.
var mwrpcStream16M = transport.Config{StreamWindow: 16 << 20}

// mwrpcLentStreamDesc describes mwrpc-lent in the streaming cell.
const mwrpcLentStreamDesc = "mwrpc-tcp's streams with each message built in registered memory, where it leaves from without a copy (ServerStream.Buffer on the server's stream, Client.Buffer on the client's), and read where it landed (RecvBytes); as rawtcp sends the same bytes every time, the sender writes only the last byte of each buffer, which the receiver checks"

// bulkImpl is the bulk service's implementation: with lent, the server's messages are
// built in ServerStream.Buffer's memory.
type bulkImpl struct{ lent bool }

// mwrpcBulkDesc is the bulk service, by hand: Download streams the bytes a bulkRequest
// (the stream's request) asks for; Upload reads the client's stream to its end and answers
// with the count.
var mwrpcBulkDesc = rpc.ServiceDesc{
	ServiceName: "bench.Bulk",
	Streams: []rpc.StreamDesc{
		{StreamName: "Download", ServerStreams: true, Codec: codec.Raw{}, Handler: mwrpcDownload},
		{StreamName: "Upload", ClientStreams: true, Codec: codec.Raw{}, Handler: mwrpcUpload},
	},
}

const (
	mwrpcDownloadMethod = "/bench.Bulk/Download"
	mwrpcUploadMethod   = "/bench.Bulk/Upload"
)

func mwrpcDownload(impl any, s *rpc.ServerStream) (any, error) {
	var req []byte
	if err := s.Request(&req); err != nil {
		return nil, err
	}
	total, chunk, err := parseBulkRequest(req)
	if err != nil {
		return nil, err
	}
	next := bulkMessages(s.Buffer, nil)
	if !impl.(bulkImpl).lent {
		next = bulkMessages(nil, payload(chunk))
	}
	for sent := int64(0); sent < total; {
		n := chunkLen(total, sent, chunk)
		msg, err := next(n)
		if err != nil {
			return nil, err
		}
		if err := s.SendBytes(msg); err != nil {
			return nil, err
		}
		sent += int64(n)
	}
	return nil, nil
}

// bulkMessages returns what makes a bulk transfer's next message of n bytes: with buffer
// (a lent sender's), n bytes of registered memory from it whose last byte (the one the
// receiver checks) is the pattern's, since like rawtcp's sender, which sends the same
// bytes every time, a lent sender does not write the rest again; without, a prefix of
// fixed.
func bulkMessages(buffer func(int) ([]byte, error), fixed []byte) func(n int) ([]byte, error) {
	if buffer == nil {
		return func(n int) ([]byte, error) { return fixed[:n], nil }
	}
	return func(n int) ([]byte, error) {
		b, err := buffer(n)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			b[n-1] = patternByte(n - 1)
		}
		return b, nil
	}
}

func mwrpcUpload(_ any, s *rpc.ServerStream) (any, error) {
	var got int64
	for {
		p, err := s.RecvBytes()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if err := checkChunk("mwrpc", p, len(p)); err != nil {
			return nil, err
		}
		got += int64(len(p))
	}
	return bulkReply(got), nil
}

func serveMwrpcStream(ln net.Listener) (Server, error) { return serveMwrpcBulk(ln, bulkImpl{}) }

func serveMwrpcLentStream(ln net.Listener) (Server, error) {
	return serveMwrpcBulk(ln, bulkImpl{lent: true})
}

func serveMwrpcStream16M(ln net.Listener) (Server, error) {
	return serveMwrpcBulk(ln, bulkImpl{}, rpc.WithTransport(mwrpcStream16M))
}

// serveMwrpcBulk serves the bulk service over the soft TCP fabric, on a device of its own.
func serveMwrpcBulk(ln net.Listener, impl bulkImpl, opts ...rpc.ServerOption) (Server, error) {
	dev, err := soft.OpenTCP("bench-server")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	s := &mwrpcServer{dev: dev, served: make(chan error, 1)}
	s.srv = rpc.NewServer(append([]rpc.ServerOption{rpc.WithDevice(dev)}, opts...)...)
	s.srv.RegisterService(&mwrpcBulkDesc, impl)
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

func dialMwrpcStream(addr string) (StreamInstance, error) { return dialMwrpcBulk(addr, false) }

func dialMwrpcLentStream(addr string) (StreamInstance, error) { return dialMwrpcBulk(addr, true) }

func dialMwrpcStream16M(addr string) (StreamInstance, error) {
	return dialMwrpcBulk(addr, false, rpc.WithTransport(mwrpcStream16M))
}

// mwrpcBulkClient is one rpc.Client (one connection), a stream per transfer.
type mwrpcBulkClient struct {
	client *rpc.Client
	dev    *soft.Device
	buf    []byte
	lent   bool // the upload's messages are built in Client.Buffer's memory
}

func dialMwrpcBulk(addr string, lent bool, opts ...rpc.DialOption) (StreamInstance, error) {
	dev, err := soft.OpenTCP("bench-client")
	if err != nil {
		return nil, fmt.Errorf("soft.OpenTCP: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := rpc.Dial(ctx, addr, append([]rpc.DialOption{rpc.WithDevice(dev)}, opts...)...)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("rpc.Dial: %w", err), dev.Close())
	}
	m := &mwrpcBulkClient{client: client, dev: dev, lent: lent}
	// One small download now, so that the connection is up before anything is measured.
	if err := m.Download(ctx, 1, 1); err != nil {
		return nil, errors.Join(fmt.Errorf("first stream: %w", err), m.Close())
	}
	return m, nil
}

func (m *mwrpcBulkClient) Download(ctx context.Context, total int64, chunk int) error {
	cs, err := m.client.NewStream(ctx, mwrpcDownloadMethod, bulkRequest(total, chunk))
	if err != nil {
		return err
	}
	defer cs.Close()
	for got := int64(0); got < total; {
		p, err := cs.RecvBytes()
		if err != nil {
			return fmt.Errorf("mwrpc: receive at %d of %d: %w", got, total, err)
		}
		n := chunkLen(total, got, chunk)
		if err := checkChunk("mwrpc", p, n); err != nil {
			return err
		}
		got += int64(n)
	}
	if _, err := cs.RecvBytes(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("mwrpc: after the last chunk: %v, want io.EOF", err)
	}
	return nil
}

func (m *mwrpcBulkClient) Upload(ctx context.Context, total int64, chunk int) error {
	if len(m.buf) != chunk && !m.lent {
		m.buf = payload(chunk)
	}
	next := bulkMessages(nil, m.buf)
	if m.lent {
		next = bulkMessages(func(n int) ([]byte, error) { return m.client.Buffer(ctx, n) }, nil)
	}
	cs, err := m.client.NewStream(ctx, mwrpcUploadMethod, nil)
	if err != nil {
		return err
	}
	defer cs.Close()
	for sent := int64(0); sent < total; {
		n := chunkLen(total, sent, chunk)
		msg, err := next(n)
		if err != nil {
			return err
		}
		if err := cs.SendBytes(msg); err != nil {
			return fmt.Errorf("mwrpc: send at %d of %d: %w", sent, total, err)
		}
		sent += int64(n)
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	var reply []byte
	if err := cs.RecvMsg(&reply); err != nil {
		return fmt.Errorf("mwrpc: upload's answer: %w", err)
	}
	return checkBulkReply("mwrpc", reply, total)
}

func (m *mwrpcBulkClient) Close() error {
	return errors.Join(m.client.Close(), m.dev.Close())
}
