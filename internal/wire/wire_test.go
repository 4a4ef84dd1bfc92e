package wire

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// unhex reads hex with spaces, for byte-exact expectations.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every message, byte for byte as Valkey lays it out (big-endian, reserved zero).
var exact = []struct {
	name     string
	msg      Message
	extended bool
	wire     string
}{
	{"GetServerFeature", Message{Op: OpGetServerFeature, Select: 0x0102, Features: 0x1122334455667788}, false,
		"0000 0102 00000000 00000000 00000000 00000000 00000000 1122334455667788"},
	{"SetClientFeature", Message{Op: OpSetClientFeature, Select: 7, Features: 0}, false,
		"0001 0007 00000000 00000000 00000000 00000000 00000000 0000000000000000"},
	{"Keepalive", Message{Op: OpKeepalive}, false,
		"0002 0000 00000000 00000000 00000000 00000000 00000000 00000000 00000000"},
	{"RegisterXferMemory", Message{Op: OpRegisterXferMemory, Addr: 0x00007f0012345000, Length: 1 << 20, RKey: 0xdeadbeef}, false,
		"0003 0000 00000000 00000000 00000000 00007f0012345000 00100000 deadbeef"},
	{"Credit", Message{Op: OpCredit, ConsumedBytes: 0x0102030405060708, Receives: 99}, true,
		"7201 0000 00000000 00000000 00000000 0102030405060708 00000063 00000000"},
	{"Shutdown", Message{Op: OpShutdown}, true,
		"7202 0000 00000000 00000000 00000000 00000000 00000000 00000000 00000000"},
	{"Shutdown at a position (FeatureEndAt)", Message{Op: OpShutdown, At: 0x1112131415161718}, true,
		"7202 0000 00000000 1112131415161718 00000000 00000000 00000000 00000000"},
	{"Close at a position (FeatureEndAt)", Message{Op: OpClose, At: 0x0102030405060708}, true,
		"7205 0000 00000000 0102030405060708 00000000 00000000 00000000 00000000"},
	{"Resume", Message{Op: OpResume, ReceivedBytes: 0x1112131415161718, ConsumedBytes: 0x0102030405060708}, true,
		"7203 0000 00000000 1112131415161718 0102030405060708 00000000 00000000"},
	{"Written", Message{Op: OpWritten, Length: 0x00012345}, true,
		"7204 0000 00000000 00000000 00000000 00000000 00000000 00012345 00000000"},
	{"Close", Message{Op: OpClose}, true,
		"7205 0000 00000000 00000000 00000000 00000000 00000000 00000000 00000000"},
	{"Ring", Message{Op: OpRing, Addr: 0x00007f0012345000, Length: 64 << 10, RKey: 0xdeadbeef}, true,
		"7206 0000 00000000 00000000 00000000 00007f0012345000 00010000 deadbeef"},
	{"RingAt", Message{Op: OpRingAt, At: 0x1112131415161718}, true,
		"7207 0000 00000000 1112131415161718 00000000 00000000 00000000 00000000"},
}

func TestMessagesByteExact(t *testing.T) {
	for _, c := range exact {
		want := unhex(t, c.wire)
		var b [MessageSize]byte
		c.msg.Encode(&b)
		if string(b[:]) != string(want) {
			t.Errorf("%s encodes as\n% x\nwant\n% x", c.name, b, want)
		}
		got, err := Decode(want, c.extended)
		if err != nil {
			t.Errorf("%s: decode: %v", c.name, err)
		}
		if diff := cmp.Diff(c.msg, got); diff != "" {
			t.Errorf("%s decodes differently (-want +got):\n%s", c.name, diff)
		}
	}
}

func TestAllZeroIsGetServerFeature(t *testing.T) {
	m, err := Decode(make([]byte, MessageSize), false)
	if err != nil || m != (Message{Op: OpGetServerFeature}) {
		t.Fatalf("all-zero message = %+v, %v; want GetServerFeature", m, err)
	}
}

func TestReservedBytesIgnored(t *testing.T) {
	b := unhex(t, "0003 ffff ffffffff ffffffff ffffffff 0000000000001000 00010000 00000042")
	m, err := Decode(b, false)
	if err != nil {
		t.Fatal(err)
	}
	if m != (Message{Op: OpRegisterXferMemory, Addr: 0x1000, Length: 0x10000, RKey: 0x42}) {
		t.Fatalf("decoded %+v", m)
	}
}

func TestMalformedMessages(t *testing.T) {
	ext := unhex(t, "7201 0000 00000000 00000000 00000000 0000000000000001 00000001 00000000")
	cases := []struct {
		name     string
		b        []byte
		extended bool
	}{
		{"short", make([]byte, 31), true},
		{"long", make([]byte, 33), true},
		{"empty", nil, true},
		{"unknown opcode", unhex(t, "0004 0000 00000000 00000000 00000000 00000000 00000000 00000000 00000000"), true},
		{"extension opcode in Valkey mode", ext, false},
	}
	for _, c := range cases {
		_, err := Decode(c.b, c.extended)
		var pe *ProtocolError
		if !errors.As(err, &pe) || !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: Decode = %v, want a *ProtocolError", c.name, err)
		}
	}
}

func TestHello(t *testing.T) {
	h := Hello{Version: HelloVersion, Features: FeatureRing | FeatureShutdown, RecvDepth: 512, RingSize: 1 << 20}
	b := h.Encode()
	// Feature bits are wire values, documented in docs/protocol.md.
	if FeatureRing != 1 || FeatureShutdown != 2 {
		t.Fatalf("feature bits moved: ring %d, half-close %d", FeatureRing, FeatureShutdown)
	}
	want := unhex(t, "72646d616e657400 01 00 00000003 0200 00100000")
	if string(b) != string(want) {
		t.Fatalf("hello encodes as % x, want % x", b, want)
	}
	if len(b) > 56 {
		t.Fatalf("hello of %d bytes does not fit a connect request's 56", len(b))
	}
	// The transport pads private data with zeros; the padding is ignored.
	got, ok, err := DecodeHello(append(b, make([]byte, 36)...))
	if err != nil || !ok || got != h {
		t.Fatalf("DecodeHello = %+v, %v, %v", got, ok, err)
	}
}

func TestSessionHello(t *testing.T) {
	if FeatureResume != 4 || FeatureClose != 32 {
		t.Fatalf("feature bits moved: resume %d, close %d", FeatureResume, FeatureClose)
	}
	id := SessionID{0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xaf}
	h := Hello{Version: HelloVersion, Features: FeatureRing | FeatureShutdown | FeatureResume, RecvDepth: 256, RingSize: 1 << 18,
		Resume: true, Session: id, Generation: 3, SendRing: 1 << 17, TCPPort: 0xa1b2}
	b := h.Encode()
	want := unhex(t, "72646d616e657400 01 01 00000007 0100 00040000 a00102030405060708090a0b0c0d0eaf 00000003 00020000 a1b2 0000")
	if string(b) != string(want) {
		t.Fatalf("session hello encodes as % x, want % x", b, want)
	}
	if len(b) > 56 {
		t.Fatalf("session hello of %d bytes does not fit a connect request's 56", len(b))
	}
	got, ok, err := DecodeHello(append(b, make([]byte, 8)...))
	if err != nil || !ok || got != h {
		t.Fatalf("DecodeHello = %+v, %v, %v", got, ok, err)
	}
	if s := id.String(); strings.Contains(s, "0405") || !strings.HasPrefix(s, "a0010203") {
		t.Errorf("a session id prints as %q: it must show no more than its first 4 bytes", s)
	}

	bad := map[string]Hello{
		"no transmit ring":       {Version: 1, Features: FeatureRing | FeatureResume, RecvDepth: 1, RingSize: 1},
		"without the ring":       {Version: 1, Features: FeatureResume, RecvDepth: 1, RingSize: 1, SendRing: 1},
		"resume of no session":   {Version: 1, Features: FeatureRing | FeatureResume, RecvDepth: 1, RingSize: 1, SendRing: 1, Resume: true},
		"close without sessions": {Version: 1, Features: FeatureRing | FeatureClose, RecvDepth: 1, RingSize: 1},
	}
	for name, h := range bad {
		if _, ok, err := DecodeHello(h.Encode()); ok || !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: DecodeHello = ok %v, %v; want a protocol error", name, ok, err)
		}
	}
	if _, ok, err := DecodeHello(b[:HelloSize]); ok || !errors.Is(err, ErrProtocol) {
		t.Errorf("a session hello cut to %d bytes: ok %v, %v; want a protocol error", HelloSize, ok, err)
	}
}

// TestGroupHello: a group's Hello carries the sender's process, the group
// (bytes 20-35) and the dialer's TCP port (36-37), and fits a connect
// request; cut short, or offering
// moves without a group, it is a protocol error.
func TestGroupHello(t *testing.T) {
	if FeatureGroup != 256 || FeatureGroupMove != 512 {
		t.Fatalf("feature bits moved: group %d, move %d", FeatureGroup, FeatureGroupMove)
	}
	h := Hello{Version: HelloVersion, Features: FeatureRing | FeatureRecvCredit | FeatureRecvGrant | FeatureGroup | FeatureGroupMove,
		RecvDepth: 2048, RingSize: 4096, Process: 0x0102030405060708, Group: 0x1112131415161718, TCPPort: 0xc0de}
	b := h.Encode()
	want := unhex(t, "72646d616e657400 01 00 00000391 0800 00001000 0102030405060708 1112131415161718 c0de")
	if string(b) != string(want) {
		t.Fatalf("group hello encodes as % x, want % x", b, want)
	}
	if len(b) > 56 {
		t.Fatalf("group hello of %d bytes does not fit a connect request's 56", len(b))
	}
	if got, ok, err := DecodeHello(b); err != nil || !ok || got != h {
		t.Fatalf("DecodeHello = %+v, %v, %v", got, ok, err)
	}
	for _, n := range []int{HelloSize, GroupHelloSize - 1} {
		if _, ok, err := DecodeHello(b[:n]); ok || !errors.Is(err, ErrProtocol) {
			t.Errorf("a group hello cut to %d bytes: ok %v, %v; want a protocol error", n, ok, err)
		}
	}
	if HelloSizeOf(h.Features) != GroupHelloSize {
		t.Errorf("HelloSizeOf(%#x) = %d, want %d", uint32(h.Features), HelloSizeOf(h.Features), GroupHelloSize)
	}
	h.Features &^= FeatureGroup
	if _, ok, err := DecodeHello(h.Encode()); ok || !errors.Is(err, ErrProtocol) {
		t.Errorf("moves without a group: ok %v, %v; want a protocol error", ok, err)
	}
}

// TestLinkFeatureHello: an iWARP dialer's Hello offers the link features
// and says in byte 9 that it needs them.
func TestLinkFeatureHello(t *testing.T) {
	if FeatureWriteNotice != 8 || FeatureRecvCredit != 16 {
		t.Fatalf("feature bits moved: write notice %d, receive credit %d", FeatureWriteNotice, FeatureRecvCredit)
	}
	iwarp := FeatureWriteNotice | FeatureRecvCredit
	h := Hello{Version: HelloVersion, Features: FeatureRing | FeatureShutdown | iwarp, RecvDepth: 256, RingSize: 1 << 18,
		Needs: iwarp}
	b := h.Encode()
	want := unhex(t, "72646d616e657400 01 06 0000001b 0100 00040000")
	if string(b) != string(want) {
		t.Fatalf("hello encodes as % x, want % x", b, want)
	}
	got, ok, err := DecodeHello(b)
	if err != nil || !ok || got != h {
		t.Fatalf("DecodeHello = %+v, %v, %v", got, ok, err)
	}
	// A receiver on a shared receive queue: it offers every link feature
	// and needs credit and grants (feature 128, byte 9's bit 8), from a
	// first grant of 8.
	grant := Hello{Version: HelloVersion, Features: FeatureRing | FeatureShutdown | LinkFeatures, RecvDepth: 8, RingSize: 1 << 18,
		Needs: FeatureRecvCredit | FeatureRecvGrant}
	if b, want := grant.Encode(), unhex(t, "72646d616e657400 01 0c 0000009b 0008 00040000"); string(b) != string(want) {
		t.Fatalf("a granting hello encodes as % x, want % x", b, want)
	}
	if got, ok, err := DecodeHello(grant.Encode()); err != nil || !ok || got != grant {
		t.Fatalf("a granting hello: DecodeHello = %+v, %v, %v", got, ok, err)
	}
	// With a session too: the flags share byte 9 with resume.
	h.Features |= FeatureResume
	h.Resume, h.Session, h.SendRing = true, SessionID{1}, 4096
	if got, ok, err := DecodeHello(h.Encode()); err != nil || !ok || got != h {
		t.Fatalf("session: DecodeHello = %+v, %v, %v", got, ok, err)
	}

	bad := map[string]Hello{
		"needs what it does not offer": {Version: 1, Features: FeatureRing, RecvDepth: 8, RingSize: 1, Needs: FeatureWriteNotice},
		"credit without the ring":      {Version: 1, Features: FeatureRecvCredit, RecvDepth: 8, RingSize: 1},
		"grants without credit":        {Version: 1, Features: FeatureRing | FeatureRecvGrant, RecvDepth: 8, RingSize: 1},
	}
	for name, h := range bad {
		if _, ok, err := DecodeHello(h.Encode()); ok || !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: DecodeHello = ok %v, %v; want a protocol error", name, ok, err)
		}
	}
}

func TestNoHello(t *testing.T) {
	for _, data := range [][]byte{nil, make([]byte, 56), []byte("rdmane"), []byte("something else entirely")} {
		if _, ok, err := DecodeHello(data); ok || err != nil {
			t.Errorf("DecodeHello(%q) = ok %v, %v; want no hello", data, ok, err)
		}
	}
}

func TestMalformedHello(t *testing.T) {
	good := Hello{Version: 1, RecvDepth: 1}.Encode()
	truncated := good[:12]
	v0 := append([]byte(nil), good...)
	v0[8] = 0
	noRecv := Hello{Version: 1}.Encode()
	endAtAlone := Hello{Version: 1, RecvDepth: 1, Features: FeatureRing | FeatureEndAt}.Encode()
	openRingAlone := Hello{Version: 1, RecvDepth: 1, Features: FeatureRing | FeatureOpenRing}.Encode()
	for name, data := range map[string][]byte{"truncated": truncated, "version 0": v0, "no receives": noRecv,
		"end positions without half-close": endAtAlone, "rings named by the open without a group": openRingAlone} {
		if _, ok, err := DecodeHello(data); ok || !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: DecodeHello = ok %v, %v; want a protocol error", name, ok, err)
		}
	}
}

// FuzzDecode: any bytes decode to a message or a *ProtocolError, never a panic,
// and whatever decodes re-encodes to a message that decodes the same.
func FuzzDecode(f *testing.F) {
	for _, c := range exact {
		f.Add(unhex(f, c.wire), c.extended)
	}
	f.Add(make([]byte, 31), false)
	f.Fuzz(func(t *testing.T, b []byte, extended bool) {
		m, err := Decode(b, extended)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		var enc [MessageSize]byte
		m.Encode(&enc)
		again, err := Decode(enc[:], extended)
		if err != nil || again != m {
			t.Fatalf("re-encoded %+v decodes as %+v, %v", m, again, err)
		}
		if _, ok, err := DecodeHello(b); ok && err != nil {
			t.Fatal("DecodeHello returned ok with an error")
		}
	})
}

// FuzzDecodeGroup: any 32 bytes decode to a group message or a protocol
// error, never a panic; what decodes encodes back to the same bytes but
// for what the message does not carry.
func FuzzDecodeGroup(f *testing.F) {
	for _, g := range []GroupMessage{
		{Op: OpStreamOpen, From: MakeStreamTag(1, 1), Port: 6379, FromPort: 40000, Grant: 8, RingSize: 16 << 10, RKey: 7, Addr: 1 << 40},
		{Op: OpStreamAccept, To: MakeStreamTag(1, 1), From: MakeStreamTag(9, 2), Grant: 8, RingSize: 16 << 10, RKey: 7, Addr: 1 << 40},
		{Op: OpStreamRefuse, To: MakeStreamTag(1, 1), Reason: ReasonBacklog},
		{Op: OpStreamClose, To: MakeStreamTag(1, 1), From: MakeStreamTag(9, 2), Reason: ReasonRNR},
		{Op: OpStreamClosed, To: MakeStreamTag(1, 1), From: MakeStreamTag(9, 2)},
		{Op: OpStreamMove, To: MakeStreamTag(1, 1), From: MakeStreamTag(9, 2), Grant: 8, Reason: MoveRebalance},
		{Op: OpStreamMoved, To: MakeStreamTag(1, 1), From: MakeStreamTag(9, 2), Reason: ReasonGone},
	} {
		var b [MessageSize]byte
		g.Encode(&b)
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var b [MessageSize]byte
		copy(b[:], data)
		g, err := DecodeGroup(&b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v is not a protocol error", err)
			}
			return
		}
		var again [MessageSize]byte
		g.Encode(&again)
		g2, err := DecodeGroup(&again)
		if err != nil || g2 != g {
			t.Fatalf("%+v encodes to %x, which decodes to %+v, %v", g, again, g2, err)
		}
	})
}

// TestDecodeMove: a move that gives no credit, a refusal that gives some,
// and a move for a reason there is none are protocol errors.
func TestDecodeMove(t *testing.T) {
	for _, g := range []GroupMessage{
		{Op: OpStreamMove, To: MakeStreamTag(1, 1), From: MakeStreamTag(2, 1)},
		{Op: OpStreamMove, To: MakeStreamTag(1, 1), From: MakeStreamTag(2, 1), Grant: 8, Reason: 2},
		{Op: OpStreamMoved, To: MakeStreamTag(1, 1), From: MakeStreamTag(2, 1), Grant: 8, Reason: ReasonGone},
		{Op: OpStreamMoved, To: MakeStreamTag(1, 1), From: MakeStreamTag(2, 1)},
		{Op: OpStreamMoved, To: MakeStreamTag(1, 1), Grant: 8},
	} {
		var b [MessageSize]byte
		g.Encode(&b)
		if _, err := DecodeGroup(&b); !errors.Is(err, ErrProtocol) {
			t.Errorf("%+v decodes with %v, want a protocol error", g, err)
		}
	}
}

func TestStreamTag(t *testing.T) {
	tag := MakeStreamTag(MaxStreamSlot, 255)
	if tag.Slot() != MaxStreamSlot || tag.Gen() != 255 {
		t.Errorf("tag %#x: slot %d gen %d", uint32(tag), tag.Slot(), tag.Gen())
	}
	var b [MessageSize]byte
	SetStream(&b, tag)
	if StreamOf(&b) != tag || b[3] != 0 || b[8] != 0 {
		t.Errorf("bytes %x", b)
	}
}
