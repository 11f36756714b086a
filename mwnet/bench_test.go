package mwnet

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// BenchmarkEcho writes a message and reads its echo, one at a time, over mwnet on each
// fabric and over loopback TCP (the floor): the per-round-trip cost a net.Conn program
// (gRPC-Go's HTTP/2 framing excluded) pays. Numbers on a loaded machine are indicative;
// allocs/op are structural.
func BenchmarkEcho(b *testing.B) {
	for _, size := range []int{64, 64 << 10} {
		fabrics := targets(b)
		fabrics["rawtcp"] = ""
		for name, target := range fabrics {
			b.Run(fmt.Sprintf("%s/%dB", name, size), func(b *testing.B) {
				var c, s net.Conn
				if name == "rawtcp" {
					c, s = tcpPair(b)
				} else {
					_, c, s = pair(b, target)
				}
				go func() { _, _ = io.Copy(s, s) }()
				msg, got := make([]byte, size), make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Write(msg); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, got); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return c, s
}

// BenchmarkWriters: 8 goroutines write 64 B each to one Conn (the listener's side) while
// the peer reads: Writes that come while another sends are gathered (gather.go). It
// reports SENDs per Write (structural: credit releases and acks included), besides the
// time per Write (indicative on a loaded machine).
func BenchmarkWriters(b *testing.B) {
	const writers = 8
	for name, target := range targets(b) {
		b.Run(name, func(b *testing.B) {
			l, c, s := pair(b, target)
			go func() { _, _ = io.Copy(io.Discard, c) }()
			msg := make([]byte, 64)
			before := l.Stats().Sends
			b.SetBytes(int64(len(msg)))
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := w; i < b.N; i += writers {
						if _, err := s.Write(msg); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(l.Stats().Sends-before)/float64(b.N), "SENDs/write")
		})
	}
}
