package rpc

// MD is call metadata: keys are lowercase strings, each with one or more values, as in
// gRPC. Requests carry the client's outgoing metadata; responses carry the handler's
// trailer.
type MD map[string][]string
