package discover

import "context"

//mwrpc:service
type Clock interface {
	Now(ctx context.Context, req *NowReq) (*Time, error)
}

// NowReq asks for the time.
type NowReq struct{ Zone string }

// Time is a time.
type Time struct{ Unix int64 }
