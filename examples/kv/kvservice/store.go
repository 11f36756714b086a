package kvservice

import (
	"context"
	"sync"

	"github.com/mwrpc/mwrpc/rpc"
)

// Store is an in-memory KV.
type Store struct {
	mu   sync.RWMutex
	data map[string]entry
}

type entry struct {
	value   []byte
	version int64
}

// NewStore returns an empty store.
func NewStore() *Store { return &Store{data: make(map[string]entry)} }

// Get implements KV.
func (s *Store) Get(ctx context.Context, req *GetRequest) (*GetResponse, error) {
	s.mu.RLock()
	e, ok := s.data[req.Key]
	s.mu.RUnlock()
	if !ok {
		return nil, rpc.Errorf(rpc.NotFound, "key %q not found", req.Key)
	}
	return &GetResponse{Value: e.value, Version: e.version}, nil
}

// Put implements KV. The request's Value is the store's to keep: msgpack decoded it into
// memory of its own.
func (s *Store) Put(ctx context.Context, req *PutRequest) (*PutResponse, error) {
	if req.Key == "" {
		return nil, rpc.Errorf(rpc.InvalidArgument, "empty key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.data[req.Key].version + 1
	s.data[req.Key] = entry{value: req.Value, version: v}
	return &PutResponse{Version: v}, nil
}

// Delete implements KV.
func (s *Store) Delete(ctx context.Context, req *DeleteRequest) (*DeleteResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.data[req.Key]
	delete(s.data, req.Key)
	return &DeleteResponse{Existed: ok}, nil
}
