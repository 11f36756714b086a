package bench

import (
	"bytes"
	"encoding/binary"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func rawSHMMsg(caller, size int) []byte {
	m := binary.LittleEndian.AppendUint32(nil, uint32(caller))
	m = binary.LittleEndian.AppendUint32(m, uint32(size))
	return append(m, payload(size)...)
}

// TestReadRawSHM: whole messages reach each however the bytes arrive (split anywhere,
// several in one read, one larger than the reader's first buffer), and a length above
// rawTCPMax ends the reading with an error that says so.
func TestReadRawSHM(t *testing.T) {
	small, big := rawSHMMsg(1, 64), rawSHMMsg(2, 200<<10)
	stream := append(append(append([]byte{}, small...), big...), small...)
	tests := []struct {
		name    string
		chunks  [][]byte
		want    [][]byte
		wantErr string
	}{
		{"one write", [][]byte{stream}, [][]byte{small, big, small}, "EOF"},
		{"split in the header", [][]byte{stream[:3], stream[3:]}, [][]byte{small, big, small}, "EOF"},
		{"split in the big payload", [][]byte{stream[:100], stream[100:70000], stream[70000:]}, [][]byte{small, big, small}, "EOF"},
		{"too long", [][]byte{append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0), rawTCPMax+1), 1)}, nil, "max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			go func() {
				for _, c := range tt.chunks {
					if _, err := a.Write(c); err != nil {
						return
					}
				}
				a.Close()
			}()
			var got [][]byte
			err := readRawSHM(b, func(msg []byte) error { got = append(got, bytes.Clone(msg)); return nil })
			b.Close()
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want one with %q", err, tt.wantErr)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("%d messages, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if !bytes.Equal(got[i], tt.want[i]) {
					t.Errorf("message %d: %d bytes, not the %d sent", i, len(got[i]), len(tt.want[i]))
				}
			}
		})
	}
}

// TestRawSHM: rawshm's server and client over the shm fabric, callers at once, a payload
// above the reader's first buffer included.
func TestRawSHM(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("rawshm: the shm fabric is Linux's")
	}
	for _, size := range []int{64, 100 << 10} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv, err := serveRawSHM(ln)
		if err != nil {
			ln.Close()
			t.Fatal(err)
		}
		inst, err := dialRawSHM(ln.Addr().String(), size, 4)
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					if err := inst.Call(w); err != nil {
						t.Errorf("%d bytes, caller %d: %v", size, w, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := inst.Close(); err != nil {
			t.Error(err)
		}
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	}
}

// TestRawSHMStrayResponse: a response no caller waits for ends the client's reading, and
// the callers are told why.
func TestRawSHMStrayResponse(t *testing.T) {
	a, b := net.Pipe()
	r := &rawSHMInstance{conn: b, done: make(chan struct{}), msgs: [][]byte{rawSHMMsg(0, 8)}, arrived: []chan struct{}{make(chan struct{}, 1)}}
	go r.read(8)
	go func() {
		_, _ = a.Write(rawSHMMsg(7, 8))
	}()
	<-r.done
	a.Close()
	if r.err == nil || !strings.Contains(r.err.Error(), "caller 7") {
		t.Fatalf("reader stopped with %v, want an error naming caller 7", r.err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
}
