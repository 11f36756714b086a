package rpc

// CallOption configures one call (see Header, Trailer, WaitForReady).
type CallOption interface {
	apply(*callInfo)
}

// callInfo is what call options set.
type callInfo struct {
	header, trailer *MD
	waitForReady    bool
}

type callOptionFunc func(*callInfo)

func (f callOptionFunc) apply(ci *callInfo) { f(ci) }
