package shm

import "unsafe"

func unsafeBytes(b []uint64) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b)*8) }
