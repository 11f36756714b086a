// Package pointer is a golden case of mwrpcgen (-type KV): requests and responses that
// are pointers to structs, named, aliased and unnamed.
package pointer

import "context"

// KV is a key-value store.
type KV interface {
	// Get returns the value of a key.
	Get(ctx context.Context, req *GetReq) (*GetResp, error)
	// Put sets a key; its parameters are unnamed.
	Put(context.Context, *PutReq) (*PutResp, error)
	// Delete removes a key; its types are unnamed structs.
	Delete(ctx context.Context, req *struct{ Key string }) (*struct{}, error)
	// Scan goes through an alias of a pointer type, and an alias of a struct type.
	Scan(ctx context.Context, req ScanReqPtr) (*ScanResp, error)
}

// Other is not named by -type, so nothing is generated for it.
type Other interface {
	Get(ctx context.Context, req *GetReq) (*GetResp, error)
}

// GetReq asks for a key.
type GetReq struct{ Key string }

// GetResp is a value.
type GetResp struct {
	Value []byte
	Found bool
}

// PutReq sets a key.
type PutReq struct {
	Key   string
	Value []byte
}

// PutResp says whether the key was new.
type PutResp struct{ Created bool }

// ScanReq asks for the keys with a prefix.
type ScanReq struct {
	Prefix string
	Limit  int
}

// ScanReqPtr is an alias of a pointer type.
type ScanReqPtr = *ScanReq

// ScanResp is an alias of a struct type.
type ScanResp = scanResp

type scanResp struct{ Keys []string }
