package codec

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// small is the benchmark's message: a key, a 64-byte value and a version.
type small struct {
	Key     string
	Value   []byte
	Version int64
}

type inner struct {
	A int
	B string
	C []float64
}

type embedded struct{ E bool }

type outer struct {
	Name string
	Ptr  *inner
	Nil  *inner
	In   inner
	Ins  []inner
	M    map[string]int
	MI   map[int32]string
	Tags []string
	Blob []byte
	Arr  [3]uint16
	When time.Time
	Dur  time.Duration
	Any  any
	Opt  string `msgpack:"opt,omitempty"`
	Skip string `msgpack:"-"`
	embedded
}

func sampleSmall() *small {
	return &small{Key: "user:1234", Value: bytes.Repeat([]byte{0xab}, 64), Version: 42}
}

func sampleOuter() *outer {
	return &outer{
		Name: "outer",
		Ptr:  &inner{A: -7, B: "ptr", C: []float64{1.5, math.Inf(-1)}},
		In:   inner{A: 1 << 40, B: strings.Repeat("x", 300)},
		Ins:  []inner{{A: 1}, {B: "two"}},
		M:    map[string]int{"a": 1, "b": -2},
		MI:   map[int32]string{-1: "minus one", 7: "seven"},
		Tags: []string{"", "é", "tag"},
		Blob: []byte{0, 1, 2, 0xff},
		Arr:  [3]uint16{1, 0xffff, 3},
		When: time.Unix(1700000000, 123456789),
		Dur:  1500 * time.Millisecond,
		Any:  "any string",
		Opt:  "set",
		embedded: embedded{
			E: true,
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// roundTrip encodes v with c and decodes it into a new value of v's type.
func roundTrip(t *testing.T, c Codec, v any) any {
	t.Helper()
	b, err := c.Append(nil, v)
	if err != nil {
		t.Fatalf("Append(%T): %v", v, err)
	}
	p := reflect.New(reflect.TypeOf(v))
	if err := c.Unmarshal(b, p.Interface()); err != nil {
		t.Fatalf("Unmarshal(%x) into %T: %v", b, p.Interface(), err)
	}
	return p.Elem().Interface()
}

func TestMsgpackRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		v    any
	}{
		{"int zero", 0},
		{"int negative", -1},
		{"int large", 1 << 40},
		{"int8 min", int8(math.MinInt8)},
		{"int64 min", int64(math.MinInt64)},
		{"uint8 max", uint8(math.MaxUint8)},
		{"uint64 max", uint64(math.MaxUint64)},
		{"float32", float32(1.5)},
		{"float64", math.Pi},
		{"bool true", true},
		{"bool false", false},
		{"string empty", ""},
		{"string utf8", "héllo, 世界"},
		{"string long", strings.Repeat("s", 70000)},
		{"bytes", []byte{1, 2, 3}},
		{"bytes empty", []byte{}},
		{"bytes nil", []byte(nil)},
		{"bytes large", bytes.Repeat([]byte{7}, 100000)},
		{"array", [4]byte{9, 8, 7, 6}},
		{"strings", []string{"a", "", "c"}},
		{"ints", []int64{math.MinInt64, 0, math.MaxInt64}},
		{"map string int", map[string]int{"x": 1, "y": 2}},
		{"map int string", map[int]string{1: "one", -2: "minus two"}},
		{"map string bytes", map[string][]byte{"k": {1}, "e": {}}},
		{"map nil", map[string]int(nil)},
		{"duration", 3 * time.Second},
		{"time", time.Unix(1, 2)},
		{"struct small", *sampleSmall()},
		{"pointer to struct", sampleSmall()},
		{"pointer to pointer", ptrTo(ptrTo(int64(5)))},
		{"nil pointer", (*small)(nil)},
		{"nested struct", *sampleOuter()},
		{"nested struct zero", outer{}},
		{"slice of structs", []small{*sampleSmall(), {}}},
		{"map of structs", map[string]*inner{"a": {A: 1}, "nil": nil}},
	}
	for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
		for _, tc := range cases {
			t.Run(m.mode()+"/"+tc.name, func(t *testing.T) {
				got := roundTrip(t, m, tc.v)
				want := tc.v
				if o, ok := want.(outer); ok {
					o.Skip = "" // `msgpack:"-"`
					want = o
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("round trip of %T:\n got %#v\nwant %#v", tc.v, got, want)
				}
			})
		}
	}
}

func (m Msgpack) mode() string {
	if m.ArrayStructs {
		return "array"
	}
	return "map"
}

func TestMsgpackSkipsTaggedField(t *testing.T) {
	o := sampleOuter()
	o.Skip = "not sent"
	got := roundTrip(t, Msgpack{}, o).(*outer)
	if got.Skip != "" {
		t.Errorf("field tagged `msgpack:\"-\"` decoded as %q, want it not sent", got.Skip)
	}
}

func TestMsgpackArrayStructs(t *testing.T) {
	v := sampleOuter()
	asMap, err := Msgpack{}.Append(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	asArray, err := Msgpack{ArrayStructs: true}.Append(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	if len(asArray) >= len(asMap) {
		t.Errorf("array-encoded struct is %d bytes, map-encoded %d: want smaller", len(asArray), len(asMap))
	}
	s := sampleSmall()
	sMap, _ := Msgpack{}.Append(nil, s)
	sArray, _ := Msgpack{ArrayStructs: true}.Append(nil, s)
	t.Logf("outer: map %d bytes, array %d; small: map %d bytes, array %d", len(asMap), len(asArray), len(sMap), len(sArray))
	if len(sArray) != len(sMap)-len("Key")-len("Value")-len("Version")-3 {
		t.Errorf("small: array-encoded %d bytes, map-encoded %d: want the field names (and their headers) gone", len(sArray), len(sMap))
	}
	// Either form decodes with either configuration.
	for _, data := range [][]byte{asMap, asArray} {
		for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
			var got outer
			if err := m.Unmarshal(data, &got); err != nil {
				t.Fatalf("%s Unmarshal: %v", m.mode(), err)
			}
			want := *v
			want.Skip = ""
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s Unmarshal:\n got %#v\nwant %#v", m.mode(), got, want)
			}
		}
	}
	// An array of another length does not decode into the struct.
	type fewer struct {
		Key   string
		Value []byte
	}
	var f fewer
	err = Msgpack{}.Unmarshal(sArray, &f)
	if !errors.Is(err, ErrInvalidData) {
		t.Errorf("array of 3 fields into a struct of 2: err = %v, want ErrInvalidData", err)
	}
	// The struct tag opts a single type in.
	type tagged struct {
		//lint:ignore U1000 read by msgpack through reflection
		_msgpack struct{} `msgpack:",as_array"`
		Key      string
		Version  int64
	}
	b, _ := Msgpack{}.Append(nil, &tagged{Key: "k", Version: 1})
	if want := []byte{0x92, 0xa1, 'k', 0xd3, 0, 0, 0, 0, 0, 0, 0, 1}; !bytes.Equal(b, want) {
		t.Errorf("as_array-tagged struct encodes as %x, want %x", b, want)
	}
}

func TestMsgpackAppendInPlace(t *testing.T) {
	v := sampleSmall()
	want, err := Msgpack{}.Append(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	// Room in dst: written in place after the prefix.
	dst := append(make([]byte, 0, 256), "hd"...)
	out, err := Msgpack{}.Append(dst, v)
	if err != nil {
		t.Fatal(err)
	}
	if unsafe.SliceData(out) != unsafe.SliceData(dst) {
		t.Error("Append with room in dst reallocated")
	}
	if string(out[:2]) != "hd" || !bytes.Equal(out[2:], want) {
		t.Errorf("Append(dst) = %x, want %q + %x", out, "hd", want)
	}
	// No room: grows, keeping the prefix.
	dst = append(make([]byte, 0, 4), "hd"...)
	out, err = Msgpack{}.Append(dst, v)
	if err != nil {
		t.Fatal(err)
	}
	if string(out[:2]) != "hd" || !bytes.Equal(out[2:], want) {
		t.Errorf("Append(short dst) = %x, want %q + %x", out, "hd", want)
	}
	// On error, dst comes back as it was.
	out, err = Msgpack{}.Append(dst, make(chan int))
	if err == nil || len(out) != len(dst) || unsafe.SliceData(out) != unsafe.SliceData(dst) {
		t.Errorf("Append of a chan = (%x, %v), want dst and an error", out, err)
	}
}

// TestMsgpackDecodeCopies pins what the package documents: a msgpack-decoded value does
// not alias the payload, so it survives the payload's memory being reused.
func TestMsgpackDecodeCopies(t *testing.T) {
	data, _ := Msgpack{}.Append(nil, sampleSmall())
	var got small
	if err := (Msgpack{}).Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(data))), uintptr(unsafe.Pointer(unsafe.SliceData(data)))+uintptr(len(data))
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(got.Value))); p >= lo && p < hi {
		t.Error("decoded []byte aliases the payload")
	}
	if p := uintptr(unsafe.Pointer(unsafe.StringData(got.Key))); p >= lo && p < hi {
		t.Error("decoded string aliases the payload")
	}
	for i := range data {
		data[i] = 0xee
	}
	if want := sampleSmall(); !reflect.DeepEqual(&got, want) {
		t.Errorf("after the payload was overwritten: got %+v, want %+v", got, want)
	}
}

func TestMsgpackDecodeMerges(t *testing.T) {
	// Documented: Unmarshal does not zero v; absent fields keep their values.
	data, _ := Msgpack{}.Append(nil, map[string]any{"Key": "k"})
	got := small{Key: "old", Version: 9}
	if err := (Msgpack{}).Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if got.Key != "k" || got.Version != 9 {
		t.Errorf("got %+v, want Key from data and Version kept", got)
	}
}

func TestMsgpackDepth(t *testing.T) {
	nested := func(depth int) []byte {
		b := bytes.Repeat([]byte{0x91}, depth) // fixarray of one element
		return append(b, 0xc0)                 // nil
	}
	var v any
	if err := (Msgpack{}).Unmarshal(nested(maxDepth), &v); err != nil {
		t.Errorf("%d nested arrays: %v", maxDepth, err)
	}
	for _, depth := range []int{maxDepth + 1, 1 << 20} {
		err := Msgpack{}.Unmarshal(nested(depth), &v)
		if !errors.Is(err, ErrInvalidData) || !strings.Contains(err.Error(), "nested more than 1000 deep") {
			t.Errorf("%d nested arrays: err = %v, want ErrInvalidData for the nesting", depth, err)
		}
	}
}

// TestMsgpackHugeLengths: lengths in headers are checked against the input before the
// decoder sees them, so a few bytes cannot make it allocate gigabytes.
func TestMsgpackHugeLengths(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		into any
	}{
		{"bin32", []byte{0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2}, new([]byte)},
		{"str32", []byte{0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'}, new(string)},
		{"array32", []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 1, 2, 3}, new([]int64)},
		{"map32", []byte{0xdf, 0x00, 0x10, 0x00, 0x00, 1, 2}, new(map[int]int)},
		{"ext32", []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 1}, new(any)},
		{"nested in struct", []byte{0x81, 0xa5, 'V', 'a', 'l', 'u', 'e', 0xc6, 0xff, 0xff, 0xff, 0xff}, new(small)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := Msgpack{}.Unmarshal(tc.data, tc.into)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrInvalidData) {
				t.Errorf("err = %v, want ErrInvalidData", err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
				t.Errorf("allocated %d bytes for %d bytes of input", n, len(tc.data))
			}
		})
	}
}

func TestMsgpackTruncatedAndCorrupt(t *testing.T) {
	for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
		data, err := m.Append(nil, sampleOuter())
		if err != nil {
			t.Fatal(err)
		}
		for n := range len(data) {
			var v outer
			if err := m.Unmarshal(data[:n], &v); !errors.Is(err, ErrInvalidData) {
				t.Fatalf("%s: %d of %d bytes: err = %v, want ErrInvalidData", m.mode(), n, len(data), err)
			}
		}
		// Every byte replaced by a few values: an error or a value, never a panic.
		bad := make([]byte, len(data))
		for i := range data {
			for _, b := range []byte{0x00, 0x7f, 0x80, 0x9f, 0xc1, 0xc6, 0xd3, 0xdd, 0xdf, 0xff} {
				copy(bad, data)
				bad[i] = b
				var v outer
				if err := m.Unmarshal(bad, &v); err != nil && !errors.Is(err, ErrInvalidData) && !errors.Is(err, ErrUnsupportedType) {
					t.Fatalf("%s: byte %d set to %#x: err = %v, want ErrInvalidData", m.mode(), i, b, err)
				}
			}
		}
	}
}

func TestMsgpackConcurrent(t *testing.T) {
	const goroutines, iterations = 8, 200
	var wg sync.WaitGroup
	errc := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := Msgpack{ArrayStructs: g%2 == 1}
			buf := make([]byte, 0, 128)
			for i := range iterations {
				in := small{Key: strings.Repeat("k", g+1), Value: []byte{byte(g), byte(i)}, Version: int64(g<<16 | i)}
				var err error
				buf, err = m.Append(buf[:0], &in)
				if err != nil {
					errc <- err
					return
				}
				var out small
				if err := m.Unmarshal(buf, &out); err != nil {
					errc <- err
					return
				}
				if !reflect.DeepEqual(in, out) {
					errc <- errors.New("concurrent round trip differs: " + in.Key + " vs " + out.Key)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func TestMsgpackAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops pooled objects at random")
	}
	for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
		in := sampleSmall()
		buf := make([]byte, 0, 256)
		var out small
		var err error
		encode := testing.AllocsPerRun(100, func() { buf, err = m.Append(buf[:0], in) })
		decode := testing.AllocsPerRun(100, func() {
			out = small{}
			err = m.Unmarshal(buf, &out)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: encode %.0f allocs, decode %.0f allocs", m.mode(), encode, decode)
		if encode != 0 {
			t.Errorf("%s: Append of *small into a buffer with room: %.0f allocs, want 0", m.mode(), encode)
		}
		// One for the string, one for the []byte; msgpack v5.4.1 adds one (an error value
		// it discards) for an array-encoded struct.
		want := 2.0
		if m.ArrayStructs {
			want = 3
		}
		if decode > want {
			t.Errorf("%s: Unmarshal into a zeroed small: %.0f allocs, want at most %.0f", m.mode(), decode, want)
		}
	}
}

func TestCheckMsgpackAcceptsEncoderOutput(t *testing.T) {
	for _, v := range []any{sampleOuter(), sampleSmall(), nil, uint64(math.MaxUint64), float32(1), -33, []any{int8(-5), nil, map[string]any{"a": []byte{}}},
		time.Unix(1<<40, 1), time.Unix(5, 0), time.Unix(1, 5), map[string]any{"big": bytes.Repeat([]byte{1}, 70000), "s": strings.Repeat("x", 70000)}} {
		for _, m := range []Msgpack{{}, {ArrayStructs: true}} {
			b, err := m.Append(nil, v)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkMsgpack(b); err != nil {
				t.Errorf("checkMsgpack(%s encoding of %T) = %v", m.mode(), v, err)
			}
		}
	}
}

type panicky struct{}

func (*panicky) UnmarshalMsgpack([]byte) error { panic("boom") }

func TestMsgpackDecoderPanic(t *testing.T) {
	err := Msgpack{}.Unmarshal([]byte{0x01}, new(panicky))
	if !errors.Is(err, ErrInvalidData) || !strings.Contains(err.Error(), "panicked: boom") {
		t.Errorf("err = %v, want ErrInvalidData reporting the panic", err)
	}
	// The codec still works afterwards.
	var n int
	if err := (Msgpack{}).Unmarshal([]byte{0x05}, &n); err != nil || n != 5 {
		t.Errorf("after a panic: %d, %v", n, err)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		c    Codec
		want string
	}{{Msgpack{}, "msgpack"}, {Msgpack{ArrayStructs: true}, "msgpack"}, {Raw{}, "raw"}} {
		if got := tc.c.Name(); got != tc.want {
			t.Errorf("%T.Name() = %q, want %q", tc.c, got, tc.want)
		}
	}
}
