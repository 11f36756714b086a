package codec

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// The small message of the rpc issue's allocation budget: {Key string; Value [64]byte;
// Version int64}. Append goes into a reused buffer (registered memory in the rpc layer)
// and Unmarshal into a zeroed value, as a server handling a request does.

func BenchmarkMsgpack(b *testing.B) {
	for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
		in := sampleSmall()
		buf, err := m.Append(nil, in)
		if err != nil {
			b.Fatal(err)
		}
		size := int64(len(buf))
		buf = make([]byte, 0, 256)
		var out small
		b.Run(m.mode()+"/encode", func(b *testing.B) {
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = m.Append(buf[:0], in)
			}
		})
		b.Run(m.mode()+"/decode", func(b *testing.B) {
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				out = small{}
				if err := m.Unmarshal(buf, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(m.mode()+"/roundtrip", func(b *testing.B) {
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				buf, _ = m.Append(buf[:0], in)
				out = small{}
				if err := m.Unmarshal(buf, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(m.mode()+"/roundtrip-parallel", func(b *testing.B) {
			b.SetBytes(size)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 0, 256)
				var out small
				for pb.Next() {
					buf, _ = m.Append(buf[:0], in)
					out = small{}
					if err := m.Unmarshal(buf, &out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMsgpackLibrary is the same round trip through msgpack.Marshal and
// msgpack.Unmarshal, for comparison.
func BenchmarkMsgpackLibrary(b *testing.B) {
	in := sampleSmall()
	var out small
	b.ReportAllocs()
	for b.Loop() {
		data, err := msgpack.Marshal(in)
		if err != nil {
			b.Fatal(err)
		}
		out = small{}
		if err := msgpack.Unmarshal(data, &out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckMsgpack is the well-formedness check alone, part of every Unmarshal.
func BenchmarkCheckMsgpack(b *testing.B) {
	data, _ := Msgpack{}.Append(nil, sampleSmall())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := checkMsgpack(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRaw(b *testing.B) {
	for _, n := range []int{64, 1 << 20} {
		payload := bytes.Repeat([]byte{1}, n)
		dst := make([]byte, 0, n)
		var got []byte
		name := "64B"
		if n > 64 {
			name = "1MiB"
		}
		// Decoding is what the raw path is for: a view, no copy, whatever the size.
		b.Run(name+"/decode", func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				if err := (Raw{}).Unmarshal(payload, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Encoding copies the bytes once into dst (registered memory in the rpc layer).
		b.Run(name+"/roundtrip", func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				out, err := Raw{}.Append(dst, &payload)
				if err == nil {
					err = Raw{}.Unmarshal(out, &got)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
