package codec

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// fuzzTarget is a representative message: scalars, strings and bytes, nested and
// repeated structs, pointers, maps, and interface values that accept any MessagePack.
type fuzzTarget struct {
	ID      uint64
	Name    string
	Data    []byte
	Score   float64
	Flags   [4]bool
	Inner   *inner
	Items   []small
	Labels  map[string]string
	Counts  map[int32]int64
	When    time.Time
	Any     any
	Extra   map[string]any
	Tail    []any
	Version int8
}

func fuzzSeeds(f *testing.F) {
	vals := []any{
		&fuzzTarget{},
		&fuzzTarget{
			ID: math.MaxUint64, Name: "name", Data: []byte{1, 2, 3}, Score: -0.5,
			Flags:  [4]bool{true, false, true, false},
			Inner:  &inner{A: -1, B: "b", C: []float64{math.NaN(), 2}},
			Items:  []small{*sampleSmall(), {}},
			Labels: map[string]string{"k": "v"}, Counts: map[int32]int64{-3: 1 << 40},
			When: time.Unix(1700000000, 5), Any: []any{"x", int64(1), nil, 1.5, map[string]any{"n": true}},
			Extra: map[string]any{"bytes": []byte("raw"), "list": []any{uint8(1)}},
			Tail:  []any{strings.Repeat("t", 40), time.Unix(0, 1)}, Version: -8,
		},
		sampleSmall(),
		sampleOuter(),
		map[string]any{"ID": "wrong type", "Name": 5},
	}
	for _, v := range vals {
		for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
			b, err := m.Append(nil, v)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0xc1})
	f.Add([]byte{0xc6, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0xdd, 0x7f, 0xff, 0xff, 0xff, 0x00})
	f.Add(bytes.Repeat([]byte{0x91}, 1200))
	f.Add([]byte{0xd6, 0xff, 0, 0, 0, 1})                             // timestamp32
	f.Add([]byte{0xc7, 12, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}) // timestamp96
}

// FuzzMsgpackUnmarshal decodes arbitrary input into a representative struct: it must
// return a value or an ErrInvalidData error, never panic or exhaust memory, and a value
// it returns must encode and decode again.
func FuzzMsgpackUnmarshal(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var v fuzzTarget
		err := Msgpack{}.Unmarshal(data, &v)
		if err != nil {
			if !errors.Is(err, ErrInvalidData) && !errors.Is(err, ErrUnsupportedType) {
				t.Fatalf("Unmarshal error matches neither ErrInvalidData nor ErrUnsupportedType: %v", err)
			}
			return
		}
		for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
			b, err := m.Append(nil, &v)
			if err != nil {
				t.Fatalf("%s Append of a decoded value: %v", m.mode(), err)
			}
			var w fuzzTarget
			if err := m.Unmarshal(b, &w); err != nil {
				t.Fatalf("%s Unmarshal of a re-encoded value: %v\n%x", m.mode(), err, b)
			}
		}
	})
}

// FuzzCheckMsgpack holds the well-formedness check to msgpack's own reading of the input:
// whatever msgpack can skip as exactly one value the check accepts (unless it nests too
// deeply), and whatever the check accepts msgpack can skip.
func FuzzCheckMsgpack(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		err := checkMsgpack(data)
		r := bytes.NewReader(data)
		serr := msgpack.NewDecoder(r).Skip()
		skipped := serr == nil && r.Len() == 0
		switch {
		case err == nil && !skipped:
			t.Fatalf("checkMsgpack accepts %x; msgpack's Skip: %v, %d bytes left", data, serr, r.Len())
		case err != nil && skipped && !strings.Contains(err.Error(), "nested more than"):
			t.Fatalf("checkMsgpack rejects %x, which msgpack skips: %v", data, err)
		}
	})
}
