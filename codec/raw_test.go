package codec

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unsafe"
)

// point has its own binary format, through the encoding interfaces.
type point struct{ X, Y byte }

func (p point) AppendBinary(b []byte) ([]byte, error) { return append(b, 'P', p.X, p.Y), nil }

func (p *point) UnmarshalBinary(b []byte) error {
	if len(b) != 3 || b[0] != 'P' {
		return errors.New("not a point")
	}
	p.X, p.Y = b[1], b[2]
	return nil
}

// legacy has only MarshalBinary.
type legacy struct{ s string }

func (l legacy) MarshalBinary() ([]byte, error) {
	if l.s == "" {
		return nil, errors.New("empty legacy")
	}
	return []byte(l.s), nil
}

func TestRawZeroCopy(t *testing.T) {
	backing := make([]byte, 200)
	for i := range backing {
		backing[i] = byte(i)
	}
	data := backing[10:110]
	var got []byte
	if err := (Raw{}).Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if unsafe.SliceData(got) != unsafe.SliceData(data) || len(got) != len(data) {
		t.Fatalf("Unmarshal into *[]byte did not alias the payload")
	}
	if cap(got) != len(data) {
		t.Errorf("cap = %d, want clipped to len %d", cap(got), len(data))
	}
	got = append(got, 0xee) // must reallocate, not write into backing[110]
	if backing[110] != 110 {
		t.Error("append to the decoded slice wrote past the payload")
	}
	// Empty payloads.
	got = []byte("stale")
	if err := (Raw{}).Unmarshal(nil, &got); err != nil || len(got) != 0 {
		t.Errorf("Unmarshal(nil) = %q, %v; want empty", got, err)
	}
}

func TestRawAppend(t *testing.T) {
	payload := []byte("bulk payload")
	for _, v := range []any{payload, &payload} {
		dst := append(make([]byte, 0, 64), "hd"...)
		out, err := Raw{}.Append(dst, v)
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != "hd"+string(payload) {
			t.Errorf("Append(%T) = %q", v, out)
		}
		if unsafe.SliceData(out) != unsafe.SliceData(dst) {
			t.Errorf("Append(%T) with room reallocated", v)
		}
		if n, ok := (Raw{}).Size(v); !ok || n != len(payload) {
			t.Errorf("Size(%T) = %d, %v; want %d, true", v, n, ok, len(payload))
		}
	}
	if _, ok := (Raw{}).Size(point{}); ok {
		t.Error("Size(point) reports a size")
	}
}

func TestRawBinaryInterfaces(t *testing.T) {
	b, err := Raw{}.Append([]byte("x"), point{1, 2})
	if err != nil || string(b) != "xP\x01\x02" {
		t.Fatalf("Append(point) = %q, %v", b, err)
	}
	var p point
	if err := (Raw{}).Unmarshal(b[1:], &p); err != nil || p != (point{1, 2}) {
		t.Errorf("Unmarshal(point) = %+v, %v", p, err)
	}
	err = Raw{}.Unmarshal([]byte("nope"), &p)
	if !errors.Is(err, ErrInvalidData) || !strings.Contains(err.Error(), "not a point") || !strings.Contains(err.Error(), "*codec.point") {
		t.Errorf("Unmarshal(bad point) = %v, want ErrInvalidData naming the type and the cause", err)
	}
	b, err = Raw{}.Append(nil, legacy{"old"})
	if err != nil || string(b) != "old" {
		t.Errorf("Append(legacy) = %q, %v", b, err)
	}
	if _, err := (Raw{}).Append(nil, legacy{}); err == nil || !strings.Contains(err.Error(), "empty legacy") {
		t.Errorf("Append(failing legacy) = %v, want its error", err)
	}
}

func TestRawAllocs(t *testing.T) {
	payload := bytes.Repeat([]byte{1}, 4096)
	dst := make([]byte, 0, 4096)
	var got []byte
	var err error
	n := testing.AllocsPerRun(100, func() {
		var out []byte
		out, err = Raw{}.Append(dst, &payload) // a []byte value would be boxed: one allocation
		if err == nil {
			err = Raw{}.Unmarshal(out, &got)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("Raw Append + Unmarshal: %.0f allocs, want 0", n)
	}
}

func TestErrors(t *testing.T) {
	var nilBytes *[]byte
	var nilSmall *small
	var nilPoint *point
	cases := []struct {
		name   string
		run    func() error
		target error
		msg    string // a substring of the message
	}{
		{"raw encode int", func() error { _, err := Raw{}.Append(nil, 42); return err }, ErrUnsupportedType, "cannot encode int"},
		{"raw encode string", func() error { _, err := Raw{}.Append(nil, "s"); return err }, ErrUnsupportedType, "cannot encode string"},
		{"raw encode nil", func() error { _, err := Raw{}.Append(nil, nil); return err }, ErrUnsupportedType, "cannot encode nil"},
		{"raw encode nil *[]byte", func() error { _, err := Raw{}.Append(nil, nilBytes); return err }, ErrUnsupportedType, "nil *[]uint8"},
		{"raw decode []byte", func() error { return Raw{}.Unmarshal(nil, []byte{}) }, ErrUnsupportedType, "cannot decode into []uint8"},
		{"raw decode *string", func() error { return Raw{}.Unmarshal(nil, new(string)) }, ErrUnsupportedType, "*string"},
		{"raw decode nil", func() error { return Raw{}.Unmarshal(nil, nil) }, ErrUnsupportedType, "into nil"},
		{"raw decode nil *[]byte", func() error { return Raw{}.Unmarshal(nil, nilBytes) }, ErrUnsupportedType, "nil *[]uint8"},
		{"raw decode nil *point", func() error { return Raw{}.Unmarshal(nil, nilPoint) }, ErrUnsupportedType, "nil *codec.point"},
		{"msgpack encode chan", func() error { _, err := Msgpack{}.Append(nil, make(chan int)); return err }, ErrUnsupportedType, "encoding chan int"},
		{"msgpack encode func field", func() error {
			_, err := Msgpack{}.Append(nil, &struct{ F func() }{})
			return err
		}, ErrUnsupportedType, "func()"},
		{"msgpack decode non-pointer", func() error { return Msgpack{}.Unmarshal([]byte{0x80}, small{}) }, ErrUnsupportedType, "into codec.small"},
		{"msgpack decode nil", func() error { return Msgpack{}.Unmarshal([]byte{0x80}, nil) }, ErrUnsupportedType, "into nil"},
		{"msgpack decode nil pointer", func() error { return Msgpack{}.Unmarshal([]byte{0x80}, nilSmall) }, ErrUnsupportedType, "nil *codec.small"},
		{"msgpack decode chan", func() error { return Msgpack{}.Unmarshal([]byte{0xc0 + 2}, new(chan int)) }, ErrUnsupportedType, "chan int"},
		{"msgpack empty", func() error { return Msgpack{}.Unmarshal(nil, new(small)) }, ErrInvalidData, "truncated"},
		{"msgpack reserved code", func() error { return Msgpack{}.Unmarshal([]byte{0xc1}, new(any)) }, ErrInvalidData, "reserved code 0xc1"},
		{"msgpack truncated string", func() error { return Msgpack{}.Unmarshal([]byte{0xa5, 'a', 'b'}, new(string)) }, ErrInvalidData, "needs 5 more bytes, 2 left"},
		{"msgpack truncated length", func() error { return Msgpack{}.Unmarshal([]byte{0xda, 0}, new(string)) }, ErrInvalidData, "2-byte length"},
		{"msgpack trailing bytes", func() error { return Msgpack{}.Unmarshal([]byte{0x01, 0x02}, new(int)) }, ErrInvalidData, "1 trailing bytes"},
		{"msgpack type mismatch", func() error { return Msgpack{}.Unmarshal([]byte{0xa1, 'x'}, new(int64)) }, ErrInvalidData, "into *int64"},
		{"msgpack struct mismatch", func() error {
			return Msgpack{}.Unmarshal([]byte{0x81, 0xa3, 'K', 'e', 'y', 0x05}, new(small))
		}, ErrInvalidData, "into *codec.small"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if !errors.Is(err, tc.target) {
				t.Fatalf("err = %v, want %v", err, tc.target)
			}
			if !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), "codec: ") {
				t.Errorf("err = %q, want it to start with \"codec: \" and contain %q", err, tc.msg)
			}
		})
	}
}
