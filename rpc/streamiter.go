package rpc

import (
	"context"
	"io"
	"iter"
)

// The iterator view of streams, which generated code uses. A service declares its
// streaming methods with iter.Seq2[T, error] for a stream of T, in the same interface as
// its unary ones, and the generated client implements that interface too:
//
//	Download(ctx context.Context, req *Req) iter.Seq2[*Chunk, error]              // server streaming
//	Upload(ctx context.Context, in iter.Seq2[*Chunk, error]) (*Summary, error)    // client streaming
//	Echo(ctx context.Context, in iter.Seq2[*Msg, error]) iter.Seq2[*Msg, error]  // bidirectional
//
// A stream's receiver ranges over it; its sender returns (or passes) an iterator that
// yields what to send. Flow control is the range loop's pace: a sender's yield blocks
// while the receiver's window is full, and returns false once the stream is over (the
// caller canceled or went away), when the producer must return (Cause says why). An error ends the stream:
// a producer yields (zero, err) to end it with err's status; a receiver sees (zero, err)
// when the stream failed, and then no more.

// Slice returns an iterator that yields the elements of s in order, with no error: a
// stream to send made from what is already at hand.
func Slice[T any](s []T) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for _, v := range s {
			if !yield(v, nil) {
				return
			}
		}
	}
}

// Cause says why a streaming handler's stream ended, for a producer whose yield returned
// false: given the handler's context (or one derived from it), it returns the status of
// the send that failed (Canceled when the caller canceled or broke out of its loop,
// DeadlineExceeded, Unavailable when the connection failed, ResourceExhausted for a
// message over the size limit, ...), which ctx.Err() alone does not always tell. Before
// any send failed, and for other contexts, it returns context.Cause(ctx): nil while ctx
// lives. Call it from the goroutine that sends (the handler's or the producer's).
func Cause(ctx context.Context) error {
	if st, ok := ctx.Value(streamKey{}).(*serverStream); ok && st.ss != nil && st.ss.sendErr != nil {
		return st.ss.sendErr
	}
	return context.Cause(ctx)
}

// MessageReceiver is what RecvAll and the Recv functions read from: a ClientStream or a
// ServerStream.
type MessageReceiver interface {
	RecvMsg(v any) error
	RecvBytes() ([]byte, error)
}

// MessageSender is what SendAll writes to: a ClientStream or a ServerStream.
type MessageSender interface {
	SendMsg(v any) error
}

// RecvPtr receives a message into a new E: the Recv function of streams of *E.
func RecvPtr[E any](r MessageReceiver) (*E, error) {
	p := new(E)
	if err := r.RecvMsg(p); err != nil {
		return nil, err
	}
	return p, nil
}

// RecvValue receives a message into a V: the Recv function of streams of V.
func RecvValue[V any](r MessageReceiver) (V, error) {
	var v V
	err := r.RecvMsg(&v)
	return v, err
}

// RecvBytes receives a []byte message, which aliases registered memory until the next
// one: the Recv function of streams of []byte (valid in the loop body that receives it).
func RecvBytes(r MessageReceiver) ([]byte, error) { return r.RecvBytes() }

// RecvAll returns the messages of r as an iterator, each received by recv (RecvPtr,
// RecvValue or RecvBytes); it ends at the sender's end, or yields the error that ended
// the stream.
func RecvAll[T any](r MessageReceiver, recv func(MessageReceiver) (T, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for {
			v, err := recv(r)
			if err == io.EOF {
				return
			}
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			if !yield(v, nil) {
				return
			}
		}
	}
}

// SendAll sends what seq yields, until it ends or yields an error (which SendAll
// returns); a failed send ends the iteration (yield returns false) and is returned.
func SendAll[T any](s MessageSender, seq iter.Seq2[T, error]) error {
	if seq == nil {
		return nil
	}
	for v, err := range seq {
		if err != nil {
			return err
		}
		if err := s.SendMsg(v); err != nil {
			return err
		}
	}
	return nil
}

// streamInvoker returns cc's StreamInvoker, or an Unimplemented error.
func streamInvoker(cc Invoker) (StreamInvoker, error) {
	si, ok := cc.(StreamInvoker)
	if !ok {
		return nil, Errorf(Unimplemented, "mwrpc: %T cannot open streams (it is not a StreamInvoker)", cc)
	}
	return si, nil
}

// ServerStreamCall calls a server-streaming method: req goes with the open, and the
// iterator yields the server's messages, each received by recv. The call starts when the
// iteration does; breaking out of the loop cancels it. opts apply to the stream's open
// (WaitForReady) and its end (Header, Trailer).
func ServerStreamCall[T any](ctx context.Context, cc Invoker, method string, req any, recv func(MessageReceiver) (T, error), opts ...CallOption) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		si, err := streamInvoker(cc)
		if err != nil {
			yield(zero, err)
			return
		}
		cs, err := si.NewStream(ctx, method, req, opts...)
		if err != nil {
			yield(zero, err)
			return
		}
		defer cs.Close()
		for v, err := range RecvAll(cs, recv) {
			if !yield(v, err) {
				return
			}
		}
	}
}

// ClientStreamCall calls a client-streaming method: it sends what in yields, then
// decodes the server's reply into reply. An error in yields cancels the call, and
// ClientStreamCall returns it; a server that answers before in is exhausted ends the
// sending, and its answer is returned. opts apply as in ServerStreamCall.
func ClientStreamCall[T any](ctx context.Context, cc Invoker, method string, in iter.Seq2[T, error], reply any, opts ...CallOption) error {
	si, err := streamInvoker(cc)
	if err != nil {
		return err
	}
	cs, err := si.NewStream(ctx, method, nil, opts...)
	if err != nil {
		return err
	}
	defer cs.Close()
	if in != nil {
		for v, err := range in {
			if err != nil {
				return err
			}
			if err := cs.SendMsg(v); err == io.EOF {
				break // the server ended the stream: RecvMsg says how
			} else if err != nil {
				return err
			}
		}
	}
	if err := cs.CloseSend(); err != nil && err != io.EOF {
		return err
	}
	err = cs.RecvMsg(reply)
	if err == io.EOF {
		return Errorf(Internal, "mwrpc: %s ended without a reply", method)
	}
	return err
}

// BidiStreamCall calls a bidirectional-streaming method: what in yields is sent from a
// goroutine of its own while the returned iterator yields the server's messages, each
// received by recv. The call starts when the iteration does, and breaking out of the loop
// cancels it; in is then asked for no more values after the one it is producing. An error
// in yields cancels the call and is what the iterator yields last. opts apply as in
// ServerStreamCall.
func BidiStreamCall[T, R any](ctx context.Context, cc Invoker, method string, in iter.Seq2[T, error], recv func(MessageReceiver) (R, error), opts ...CallOption) iter.Seq2[R, error] {
	return func(yield func(R, error) bool) {
		var zero R
		si, err := streamInvoker(cc)
		if err != nil {
			yield(zero, err)
			return
		}
		cs, err := si.NewStream(ctx, method, nil, opts...)
		if err != nil {
			yield(zero, err)
			return
		}
		defer cs.Close()
		go func() {
			if err := SendAll(cs, in); err != nil && err != io.EOF {
				cs.abortWith(err)
				return
			}
			_ = cs.CloseSend()
		}()
		for v, err := range RecvAll(cs, recv) {
			if !yield(v, err) {
				return
			}
		}
	}
}
