package nlmsg

import (
	"encoding/binary"
	"testing"
)

func TestAttrsRoundTrip(t *testing.T) {
	var b []byte
	b = append(b, Attr(1, []byte("rxe0\x00"))...)
	b = append(b, Attr(3, binary.NativeEndian.AppendUint32(nil, 7))...)
	var got []Attribute
	for a := range Attrs(b) {
		got = append(got, a)
	}
	if len(got) != 2 || got[0].Type != 1 || string(got[0].Value) != "rxe0\x00" || got[1].Type != 3 || binary.NativeEndian.Uint32(got[1].Value) != 7 {
		t.Fatalf("Attrs = %+v", got)
	}
	// Truncated and lying lengths end parsing; they never read out of bounds.
	for i := range b {
		for range Attrs(b[:i]) {
		}
	}
	bad := Attr(1, []byte("x"))
	binary.NativeEndian.PutUint16(bad, 200)
	for a := range Attrs(bad) {
		t.Errorf("an attribute longer than its message was read: %+v", a)
	}
	if _, err := Parse([]byte{255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}); err == nil {
		t.Error("a message longer than its datagram was accepted")
	}
}
