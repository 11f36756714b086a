package codec_test

import (
	"bytes"
	"fmt"

	"github.com/mwrpc/mwrpc/codec"
)

type GetReply struct {
	Key     string
	Value   []byte
	Version int64
}

func ExampleMsgpack() {
	c := codec.Msgpack{}
	// buf stands for registered memory, such as transport.ResponseWriter.Buffer's.
	buf := make([]byte, 0, 128)
	out, err := c.Append(buf[:0], &GetReply{Key: "k", Value: []byte("v"), Version: 3})
	if err != nil {
		panic(err)
	}
	var r GetReply
	if err := c.Unmarshal(out, &r); err != nil {
		panic(err)
	}
	// r does not alias out: it may be kept after out's memory is reused.
	fmt.Printf("%s=%s v%d (%d bytes, in place: %t)\n", r.Key, r.Value, r.Version, len(out), &out[0] == &buf[:1][0])
	// Output: k=v v3 (33 bytes, in place: true)
}

func ExampleMsgpack_arrayStructs() {
	v := &GetReply{Key: "k", Value: []byte("v"), Version: 3}
	asMap, _ := codec.Msgpack{}.Append(nil, v)
	asArray, _ := codec.Msgpack{ArrayStructs: true}.Append(nil, v)
	fmt.Println(len(asMap), len(asArray))
	// Output: 33 15
}

func ExampleRaw() {
	payload := []byte("bulk bytes, as received") // stands for a request payload
	var b []byte
	if err := (codec.Raw{}).Unmarshal(payload, &b); err != nil {
		panic(err)
	}
	// b is payload itself: valid only while payload is (until the handler returns).
	kept := bytes.Clone(b) // copy what must outlive it
	fmt.Println(&b[0] == &payload[0], string(kept))
	// Output: true bulk bytes, as received
}
