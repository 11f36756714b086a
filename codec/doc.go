// Package codec turns Go values into message payloads and back: a Codec appends the
// encoding of a value to a caller's slice, which may be registered memory, and decodes a
// value from a view of a payload where it landed.
//
// Two codecs are provided:
//
//   - Msgpack, the default: MessagePack through github.com/vmihailenco/msgpack/v5, with
//     pooled encoders and decoders. Structs are encoded as maps keyed by field name (the
//     schema may grow), or as positional arrays with Msgpack{ArrayStructs: true} (smaller
//     and faster, but both sides must agree on the exact field list).
//   - Raw, for payloads that are already bytes: a []byte is appended as it is, and a
//     *[]byte is decoded by pointing it at the payload, without a copy. Types that implement
//     encoding.BinaryAppender (or encoding.BinaryMarshaler) and encoding.BinaryUnmarshaler
//     bring their own format.
//
// # Which codec for bulk data
//
// Msgpack copies when it decodes: every string and []byte in the result is a fresh copy of
// the payload's bytes, and the encoder copies them into the output. That is what one wants
// for small, structured messages (the result is independent of the transport's memory and
// may be kept), and it is why a decoded small struct costs an allocation per string and
// per []byte field.
//
// For bulk data (file contents, blobs, anything of more than a few kilobytes) use Raw: the
// handler or caller gets a []byte that aliases the transport's registered memory, and the
// bytes are never copied beyond the transport's own transfer (the eager SEND or the RDMA
// READ). On the sending side Raw.Append copies a []byte into dst once (registered memory,
// in place of the copy the transport would otherwise make), and a type implementing
// encoding.BinaryAppender writes its encoding straight into dst; to send bulk data without
// any copy, produce it in ResponseWriter.Buffer's memory (or a pool buffer for CallBuf) in
// the first place and send that. Structured metadata that travels with bulk data belongs
// in a small Msgpack message of its own (or in call metadata), not around the bulk bytes.
//
// # Lifetimes
//
// The data given to Unmarshal is typically a view of registered memory: a request payload
// is valid until the handler returns, and a response's Bytes until Response.Release (every
// rule: https://github.com/mwrpc/mwrpc#buffer-lifetimes).
//
//   - Msgpack.Unmarshal copies what it keeps: the decoded value does not alias data and
//     stays valid after the memory is reused.
//   - Raw.Unmarshal into a *[]byte does not copy: the slice aliases data and is valid
//     exactly as long as data is (until the handler returns, or until Response.Release).
//     Copy it (bytes.Clone) to keep it longer. Its capacity is clipped to its length, so
//     appending to it reallocates instead of writing past the payload.
//
// Append never keeps dst or v after it returns; the pooled encoders hold no reference to
// either. All codecs are safe for concurrent use.
package codec
