// Package mwnet carries byte streams over mwrpc's fabrics: Listen returns a net.Listener
// and Dial a net.Conn, so that a program written against package net (net/http, gRPC-Go
// with grpc.WithContextDialer, anything that takes a net.Conn) runs over queue pairs
// without a rewrite.
//
// A target names the fabric: "host:port" is the soft TCP fabric, "shm:///path/to.sock"
// the same host's shared-memory fabric (Linux). WithDevice picks another verbs device
// (ibv, for example) for the queue pairs.
//
// Each net.Conn is one transport connection (one queue pair) carrying one transport
// stream: every Write is one or more stream messages (up to the peer's largest message
// each); small ones ride inside SENDs, larger ones are exposed through memory windows and
// READ by the peer, and the stream's byte window (credits) bounds what is in flight. A
// Read copies out of the message it holds, so what a Read returns is the caller's.
//
// Lifetimes: a Conn owns its transport stream and, on the dialing side, its own transport
// and device; Close releases them. A Listener owns the serving transport; Close stops
// accepting, and the transport goes once the last accepted Conn is closed too.
package mwnet
