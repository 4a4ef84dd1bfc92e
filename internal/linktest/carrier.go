package linktest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/rdmanet/sdk/internal/link"
)

// The conformance suite of link.Carrier: what a link that carries a link
// group's streams must do with their rings, whatever carries it (link.Pipe,
// tcplink in carrier mode). A carrier may make no memory of its own
// (tcplink's NewRecvRing and NewSendRing fail): the suite gets the
// streams' memory from a maker, another link of the same group, and
// registers it on the pair with ShareRecvRing and ShareSendRing, as a group
// does when a stream moves onto a link.

// Carriers is a connected pair of carriers, sized and set up as MakePair's
// links are, and the links that make the memory of their streams' rings.
type Carriers struct {
	A, B link.Carrier
	// MakerA and MakerB make (NewRecvRing, NewSendRing) the memory of the
	// rings that A and B share, as a group's RDMA link makes a stream's
	// rings before the stream moves to another link. They must outlive A
	// and B (be closed after them). nil: the suite shares plain memory
	// (make), which a link that does not use the maker takes.
	MakerA, MakerB link.Carrier
}

// MakeCarrierPair returns Carriers sized as a and b, closed when the test
// ends.
type MakeCarrierPair func(t *testing.T, a, b Spec) Carriers

// RunCarrier runs the carrier suite, each test a subtest of t.
func RunCarrier(t *testing.T, pair MakeCarrierPair) { RunCarrierWith(t, pair, Options{}) }

// RunCarrierWith runs the carrier suite with opts, each test a subtest of
// t.
func RunCarrierWith(t *testing.T, pair MakeCarrierPair, opts Options) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, MakeCarrierPair, Options)
	}{
		{"TaggedDataLandsInOrder", testTaggedData},
		{"MakersMemory", testMakersMemory},
		{"RingNames", testRingNames},
		{"EmptyBaseRings", testEmptyBaseRings},
		{"NewRings", testNewRings},
		{"CarrierMisuse", testCarrierMisuse},
		{"RemoteAccessAcrossRings", testRemoteAccessAcrossRings},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, pair, opts) })
	}
}

// ShareRecv registers a receive ring of size bytes on end, made by maker
// (plain memory if maker is nil), and returns it and its names there.
func ShareRecv(t testing.TB, end, maker link.Carrier, size int) (mem []byte, addr uint64, rkey uint32) {
	t.Helper()
	mem = makerMem(t, maker, size, false)
	addr, rkey, err := end.ShareRecvRing(maker, mem)
	if err != nil {
		t.Fatalf("ShareRecvRing of %d bytes: %v", size, err)
	}
	return mem, addr, rkey
}

// ShareSend registers a transmit ring of size bytes on end, made by maker
// (plain memory if maker is nil), and returns it and its key there.
func ShareSend(t testing.TB, end, maker link.Carrier, size int) (mem []byte, key uint32) {
	t.Helper()
	mem = makerMem(t, maker, size, true)
	key, err := end.ShareSendRing(maker, mem)
	if err != nil {
		t.Fatalf("ShareSendRing of %d bytes: %v", size, err)
	}
	if key == 0 {
		t.Fatal("ShareSendRing gave key 0, which names SendRing")
	}
	return mem, key
}

// makerMem is memory of size bytes that maker made, or plain memory.
// maker keeps it until it closes, after the pair.
func makerMem(t testing.TB, maker link.Carrier, size int, send bool) []byte {
	t.Helper()
	if maker == nil {
		return make([]byte, size)
	}
	var mem []byte
	var err error
	if send {
		mem, _, err = maker.NewSendRing(size)
	} else {
		mem, _, _, err = maker.NewRecvRing(size)
	}
	if err != nil {
		t.Fatalf("the maker's ring of %d bytes: %v", size, err)
	}
	return mem
}

// Tagged returns a SendData request of n bytes from offset off of transmit
// ring (0: SendRing) to addr in the peer's ring named rkey, with tag.
func Tagged(ring, off, n uint32, addr uint64, rkey, tag uint32, signaled bool, id uint64) link.SendWR {
	return link.SendWR{Kind: link.SendData, Signaled: signaled, ID: id, Ring: ring, Off: off, N: n, Remote: addr, RKey: rkey, Tag: tag}
}

// WantTags fails t unless the tags of cs's DataArrived completions are
// tags, in order.
func WantTags(t testing.TB, who string, cs []link.Completion, tags ...uint32) {
	t.Helper()
	var got []uint32
	for _, c := range cs {
		if c.Kind == link.DataArrived {
			got = append(got, c.Tag)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(tags) {
		t.Errorf("%s's data arrived with tags %v, want %v", who, got, tags)
	}
}

// Data from several streams' transmit rings (and SendRing) lands in the
// right receive rings of the peer's streams (and its first ring), in post
// order, each DataArrived with its request's tag; nothing outside the
// writes changes. Both directions.
func testTaggedData(t *testing.T, pair MakeCarrierPair, opts Options) {
	sa, sb := DefaultSpec(), DefaultSpec()
	sa.SendDepth, sb.RecvDepth = 16, 16
	c := pair(t, sa, sb)
	a, b := c.A, c.B
	type sendRing struct {
		mem []byte
		key uint32
	}
	type recvRing struct {
		mem  []byte
		addr uint64
		rkey uint32
	}
	var sends []sendRing
	for i, size := range []int{1000, 2000, 4096} {
		mem, key := ShareSend(t, a, c.MakerA, size)
		Fill(mem, byte(50*i+1))
		sends = append(sends, sendRing{mem, key})
	}
	Fill(a.SendRing(), 200)
	sends = append(sends, sendRing{a.SendRing(), 0})
	// What the receive rings hold is read before they are registered, so
	// that the link's writes into them come after a call of b's (over a
	// socket, the race detector sees no other order).
	var recvs []recvRing
	var want [][]byte
	for _, size := range []int{4096, 1500, 3000} {
		mem := makerMem(t, c.MakerB, size, false)
		want = append(want, bytes.Clone(mem))
		recvs = append(recvs, recvRing{mem: mem})
	}
	addr, rkey := b.RecvRingKey()
	want = append(want, bytes.Clone(b.RecvRing()))
	for i := range 3 {
		var err error
		if recvs[i].addr, recvs[i].rkey, err = b.ShareRecvRing(c.MakerB, recvs[i].mem); err != nil {
			t.Fatal(err)
		}
	}
	recvs = append(recvs, recvRing{b.RecvRing(), addr, rkey})

	type write struct{ from, off, n, to, at int }
	writes := []write{
		{0, 0, 100, 0, 0},
		{1, 10, 1500, 1, 0},
		{2, 4000, 96, 2, 2904},  // to the ring's end
		{3, 100, 50, 3, 4000},   // SendRing to the first ring
		{2, 0, 4096, 0, 0},      // a whole ring, over the first write
		{0, 999, 1, 1, 1499},    // one byte, at the end
		{1, 0, 0, 2, 3000},      // nothing, at the ring's end
		{0, 500, 500, 2, 1000},  //
		{3, 0, 3000, 2, 0},      // over part of the one before
		{1, 1999, 1, 0, 4095},   //
		{2, 1000, 1000, 3, 100}, //
	}
	var wrs []link.SendWR
	var kinds []string
	var tags []uint32
	for i, w := range writes {
		s, r := sends[w.from], recvs[w.to]
		tag := uint32(0x100*w.from + i + 1)
		wrs = append(wrs, Tagged(s.key, uint32(w.off), uint32(w.n), r.addr+uint64(w.at), r.rkey, tag, i%3 == 2, uint64(i+1)))
		copy(want[w.to][w.at:w.at+w.n], s.mem[w.off:w.off+w.n])
		kinds = append(kinds, fmt.Sprintf("data-arrived %d", w.n))
		tags = append(tags, tag)
	}
	// A marker into a stream's ring lands too, and nothing arrives for it.
	m := link.SendWR{Kind: link.SendMarker, Signaled: true, ID: 100, Remote: recvs[1].addr + 1500, RKey: recvs[1].rkey}
	Post(t, a, wrs[:5]...)
	Post(t, a, append(wrs[5:], m)...)
	cs := WaitFor(t, b, len(writes))
	WantKinds(t, "b", cs, kinds...)
	WantTags(t, "b", cs, tags...)
	WantKinds(t, "a", WaitFor(t, a, 4), "send-done 3", "send-done 6", "send-done 9", "send-done 100")
	for i, r := range recvs {
		if !bytes.Equal(r.mem, want[i]) {
			t.Errorf("b's receive ring %d (%d bytes) holds other bytes than were written", i, len(r.mem))
		}
	}

	// And the other way, into a's first ring and a ring of a stream's.
	if err := b.PostRecv(len(writes)); err != nil {
		t.Fatal(err)
	}
	bs, bkey := ShareSend(t, b, c.MakerB, 512)
	Fill(bs, 99)
	ar, araddr, arkey := ShareRecv(t, a, c.MakerA, 512)
	aaddr, akey := a.RecvRingKey()
	Post(t, b,
		Tagged(bkey, 0, 512, aaddr+1000, akey, 0xfeed_0001, false, 1),
		Tagged(bkey, 12, 500, araddr+12, arkey, 0xffff_ffff, true, 2))
	cs = WaitFor(t, a, 2)
	WantKinds(t, "a", cs, "data-arrived 512", "data-arrived 500")
	WantTags(t, "a", cs, 0xfeed_0001, 0xffff_ffff)
	WantKinds(t, "b", WaitFor(t, b, 1), "send-done 2")
	if !bytes.Equal(a.RecvRing()[1000:1512], bs) || !bytes.Equal(ar[12:], bs[12:]) || !bytes.Equal(ar[:12], make([]byte, 12)) {
		t.Error("b's data landed wrong in a's rings")
	}
}

// A ring shared on a link is the maker's memory: data lands in it there,
// and releasing the registration (ReleaseRecvRing, ReleaseSendRing)
// leaves it as it is, for the maker to give back; the same memory may be
// registered again, under a name that works.
func testMakersMemory(t *testing.T, pair MakeCarrierPair, opts Options) {
	c := pair(t, DefaultSpec(), DefaultSpec())
	a, b := c.A, c.B
	smem, rmem := make([]byte, 2048), make([]byte, 2048)
	var makerKey uint32
	var err error
	if c.MakerA != nil {
		if smem, makerKey, err = c.MakerA.NewSendRing(2048); err != nil {
			t.Fatal(err)
		}
	}
	if c.MakerB != nil {
		if rmem, _, _, err = c.MakerB.NewRecvRing(2048); err != nil {
			t.Fatal(err)
		}
	}
	skey, err := a.ShareSendRing(c.MakerA, smem)
	if err != nil {
		t.Fatal(err)
	}
	raddr, rkey, err := b.ShareRecvRing(c.MakerB, rmem)
	if err != nil {
		t.Fatal(err)
	}
	Fill(smem, 5)
	Post(t, a, Tagged(skey, 0, 2048, raddr, rkey, 1, true, 1))
	WantKinds(t, "b", WaitFor(t, b, 1), "data-arrived 2048")
	WantKinds(t, "a", WaitFor(t, a, 1), "send-done 1")
	if !bytes.Equal(rmem, smem) {
		t.Fatal("the data is not in the maker's memory")
	}
	sent, landed := bytes.Clone(smem), bytes.Clone(rmem)
	if err := a.ReleaseSendRing(skey); err != nil {
		t.Fatalf("ReleaseSendRing: %v", err)
	}
	if err := b.ReleaseRecvRing(rmem); err != nil {
		t.Fatalf("ReleaseRecvRing: %v", err)
	}
	if !bytes.Equal(smem, sent) || !bytes.Equal(rmem, landed) {
		t.Fatal("releasing a registration changed the maker's memory")
	}

	// Registered again: new names, which work.
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	skey2, err := a.ShareSendRing(c.MakerA, smem)
	if err != nil || skey2 == 0 {
		t.Fatalf("ShareSendRing again: key %d, %v", skey2, err)
	}
	raddr2, rkey2, err := b.ShareRecvRing(c.MakerB, rmem)
	if err != nil {
		t.Fatalf("ShareRecvRing again: %v", err)
	}
	Fill(smem, 77)
	Post(t, a, Tagged(skey2, 100, 100, raddr2+1000, rkey2, 2, true, 2))
	WantKinds(t, "b", WaitFor(t, b, 1), "data-arrived 100")
	WantKinds(t, "a", WaitFor(t, a, 1), "send-done 2")
	if !bytes.Equal(rmem[1000:1100], smem[100:200]) || !bytes.Equal(rmem[:1000], landed[:1000]) {
		t.Fatal("data through the second registration landed wrong")
	}
	if err := a.ReleaseSendRing(skey2); err != nil {
		t.Fatal(err)
	}
	if err := b.ReleaseRecvRing(rmem); err != nil {
		t.Fatal(err)
	}
	// The makers give their memory back, once no registration is left.
	if c.MakerA != nil {
		if err := c.MakerA.ReleaseSendRing(makerKey); err != nil {
			t.Errorf("the maker's ReleaseSendRing after the registrations went: %v", err)
		}
	}
	if c.MakerB != nil {
		if err := c.MakerB.ReleaseRecvRing(rmem); err != nil {
			t.Errorf("the maker's ReleaseRecvRing after the registrations went: %v", err)
		}
	}
}

// The names of shared rings: a receive ring's key is unique among the
// live ones (the first ring's too), and its address range overlaps no
// other ring's; a transmit ring's key is never 0 and unique among the
// live ones. Each ring takes the data sent to its name.
func testRingNames(t *testing.T, pair MakeCarrierPair, opts Options) {
	sa, sb := DefaultSpec(), DefaultSpec()
	sa.SendDepth, sb.RecvDepth = 16, 16
	c := pair(t, sa, sb)
	a, b := c.A, c.B
	type recvRing struct {
		mem  []byte
		addr uint64
		rkey uint32
	}
	addr, rkey := b.RecvRingKey()
	first := recvRing{b.RecvRing(), addr, rkey}
	var recvs []recvRing
	sends := map[uint32][]byte{}
	check := func() {
		t.Helper()
		all := append([]recvRing{first}, recvs...)
		for i, x := range all {
			for _, y := range all[i+1:] {
				if x.rkey == y.rkey {
					t.Fatalf("two receive rings with key %#x", x.rkey)
				}
				if x.addr < y.addr+uint64(len(y.mem)) && y.addr < x.addr+uint64(len(x.mem)) {
					t.Fatalf("receive rings [%#x, +%d) and [%#x, +%d) overlap", x.addr, len(x.mem), y.addr, len(y.mem))
				}
			}
		}
	}
	share := func(n int) {
		t.Helper()
		for i := range n {
			mem, addr, rkey := ShareRecv(t, b, c.MakerB, 1024+512*i)
			recvs = append(recvs, recvRing{mem, addr, rkey})
			smem, key := ShareSend(t, a, c.MakerA, 256)
			if sends[key] != nil {
				t.Fatalf("two transmit rings with key %d", key)
			}
			sends[key] = smem
		}
		check()
	}
	share(8)
	for _, i := range []int{6, 3, 0} {
		if err := b.ReleaseRecvRing(recvs[i].mem); err != nil {
			t.Fatal(err)
		}
		recvs = append(recvs[:i], recvs[i+1:]...)
	}
	for key := range sends {
		if len(sends) <= 5 {
			break
		}
		if err := a.ReleaseSendRing(key); err != nil {
			t.Fatal(err)
		}
		delete(sends, key)
	}
	share(6)
	if len(recvs) != 11 || len(sends) != 11 {
		t.Fatalf("%d receive rings and %d transmit rings, want 11 each", len(recvs), len(sends))
	}

	// Every name works: a byte from each transmit ring to the last byte
	// of each receive ring.
	i := 0
	var wrs []link.SendWR
	var want []byte
	for key, mem := range sends {
		mem[255] = byte(i + 1)
		r := recvs[i]
		wrs = append(wrs, Tagged(key, 255, 1, r.addr+uint64(len(r.mem))-1, r.rkey, uint32(i), i == len(sends)-1, uint64(i)))
		want = append(want, byte(i+1))
		i++
	}
	Post(t, a, wrs...)
	cs := WaitFor(t, b, len(wrs))
	for i, x := range cs {
		if x.Kind != link.DataArrived || x.Tag != uint32(i) || x.N != 1 {
			t.Fatalf("b's completion %d: %v %d with tag %d", i, x.Kind, x.N, x.Tag)
		}
		if r := recvs[i]; r.mem[len(r.mem)-1] != want[i] {
			t.Errorf("receive ring %d's last byte is %d, want %d", i, r.mem[len(r.mem)-1], want[i])
		}
	}
	WantKinds(t, "a", WaitFor(t, a, 1), fmt.Sprintf("send-done %d", len(wrs)-1))
}

// A carrier whose own rings are empty (a group's base link carries only
// control messages and the streams' data) works: control messages, a
// marker at its first ring, and streams' data; data into the empty first
// ring is a remote access error at both ends, and data from the empty
// SendRing misuse.
func testEmptyBaseRings(t *testing.T, pair MakeCarrierPair, opts Options) {
	s := DefaultSpec()
	s.SendRing, s.RecvRing = 0, 0
	c := pair(t, s, s)
	a, b := c.A, c.B
	if len(a.SendRing()) != 0 || len(b.RecvRing()) != 0 {
		t.Fatalf("rings of %d and %d bytes, want empty", len(a.SendRing()), len(b.RecvRing()))
	}
	smem, skey := ShareSend(t, a, c.MakerA, 100)
	Fill(smem, 1)
	rmem, raddr, rkey := ShareRecv(t, b, c.MakerB, 100)
	Post(t, a, Control(1, 0), Marker(b, 2), Tagged(skey, 0, 100, raddr, rkey, 9, true, 3))
	cs := WaitFor(t, b, 2)
	WantKinds(t, "b", cs, "control-arrived", "data-arrived 100")
	WantTags(t, "b", cs, 9)
	WantKinds(t, "a", WaitFor(t, a, 3), "send-done 1", "send-done 2", "send-done 3")
	if !bytes.Equal(rmem, smem) {
		t.Error("the data landed wrong")
	}
	Post(t, b, Control(1, 1))
	WantKinds(t, "a", WaitFor(t, a, 1), "control-arrived")
	WantKinds(t, "b", WaitFor(t, b, 1), "send-done 1")

	if err := a.PostSend([]link.SendWR{Data(b, 0, 1, 0, true, 4)}); !errors.Is(err, link.ErrMisuse) {
		t.Errorf("data from the empty SendRing: %v, want link.ErrMisuse", err)
	}
	addr, key := b.RecvRingKey()
	Post(t, a, Tagged(skey, 0, 1, addr, key, 0, true, 5))
	remoteAccessEnd(t, opts, a, b, nil, nil)
}

// NewRecvRing and NewSendRing either make a ring or fail softly: a
// carrier may make no memory of its own (then a stream's growth stops
// where it is), but asking it is no misuse.
func testNewRings(t *testing.T, pair MakeCarrierPair, opts Options) {
	c := pair(t, DefaultSpec(), DefaultSpec())
	a, b := c.A, c.B
	mem, addr, rkey, err := b.NewRecvRing(4096)
	switch {
	case errors.Is(err, link.ErrMisuse):
		t.Errorf("NewRecvRing(4096): %v, a misuse", err)
	case err == nil:
		if len(mem) != 4096 {
			t.Fatalf("NewRecvRing(4096) made %d bytes", len(mem))
		}
		smem, skey := ShareSend(t, a, c.MakerA, 64)
		Fill(smem, 3)
		Post(t, a, Tagged(skey, 0, 64, addr+4032, rkey, 1, true, 1))
		WantKinds(t, "b", WaitFor(t, b, 1), "data-arrived 64")
		WantKinds(t, "a", WaitFor(t, a, 1), "send-done 1")
		if !bytes.Equal(mem[4032:], smem) {
			t.Error("data landed wrong in NewRecvRing's ring")
		}
		if err := b.ReleaseRecvRing(mem); err != nil {
			t.Errorf("ReleaseRecvRing of NewRecvRing's ring: %v", err)
		}
	}
	smem, key, err := a.NewSendRing(4096)
	switch {
	case errors.Is(err, link.ErrMisuse):
		t.Errorf("NewSendRing(4096): %v, a misuse", err)
	case err == nil:
		if len(smem) != 4096 || key == 0 {
			t.Fatalf("NewSendRing(4096) made %d bytes with key %d", len(smem), key)
		}
		if err := a.ReleaseSendRing(key); err != nil {
			t.Errorf("ReleaseSendRing of NewSendRing's ring: %v", err)
		}
	}
}

// Calls that break Carrier's contract fail with link.ErrMisuse, and a
// PostSend that does posts nothing.
func testCarrierMisuse(t *testing.T, pair MakeCarrierPair, opts Options) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, c Carriers) error
	}{
		{"unknown transmit ring", func(t *testing.T, c Carriers) error {
			_, key := ShareSend(t, c.A, c.MakerA, 100)
			_, addr, rkey := ShareRecv(t, c.B, c.MakerB, 100)
			return c.A.PostSend([]link.SendWR{Tagged(key^0x8000_0000, 0, 1, addr, rkey, 1, true, 1)})
		}},
		{"released transmit ring", func(t *testing.T, c Carriers) error {
			_, key := ShareSend(t, c.A, c.MakerA, 100)
			_, addr, rkey := ShareRecv(t, c.B, c.MakerB, 100)
			if err := c.A.ReleaseSendRing(key); err != nil {
				return fmt.Errorf("ReleaseSendRing: %v", err)
			}
			return c.A.PostSend([]link.SendWR{Tagged(key, 0, 1, addr, rkey, 1, true, 1)})
		}},
		{"data past the transmit ring", func(t *testing.T, c Carriers) error {
			_, key := ShareSend(t, c.A, c.MakerA, 100)
			_, addr, rkey := ShareRecv(t, c.B, c.MakerB, 4096)
			return c.A.PostSend([]link.SendWR{Tagged(key, 50, 51, addr, rkey, 1, true, 1)})
		}},
		{"data the size of SendRing from a smaller ring", func(t *testing.T, c Carriers) error {
			_, key := ShareSend(t, c.A, c.MakerA, 100)
			return c.A.PostSend([]link.SendWR{Data(c.B, 0, 4096, 0, true, 1), func() link.SendWR {
				wr := Data(c.B, 0, 4096, 0, true, 2)
				wr.Ring = key
				return wr
			}()})
		}},
		{"data offset overflow", func(t *testing.T, c Carriers) error {
			_, key := ShareSend(t, c.A, c.MakerA, 100)
			_, addr, rkey := ShareRecv(t, c.B, c.MakerB, 100)
			return c.A.PostSend([]link.SendWR{Tagged(key, 1<<32-1, 2, addr, rkey, 1, true, 1)})
		}},
		{"unknown transmit ring to release", func(t *testing.T, c Carriers) error {
			_, key := ShareSend(t, c.A, c.MakerA, 100)
			return c.A.ReleaseSendRing(key ^ 0x8000_0000)
		}},
		{"transmit ring released twice", func(t *testing.T, c Carriers) error {
			_, key := ShareSend(t, c.A, c.MakerA, 100)
			if err := c.A.ReleaseSendRing(key); err != nil {
				return fmt.Errorf("ReleaseSendRing: %v", err)
			}
			return c.A.ReleaseSendRing(key)
		}},
		{"receive ring not registered", func(t *testing.T, c Carriers) error {
			return c.B.ReleaseRecvRing(make([]byte, 100))
		}},
		{"receive ring released twice", func(t *testing.T, c Carriers) error {
			mem, _, _ := ShareRecv(t, c.B, c.MakerB, 100)
			if err := c.B.ReleaseRecvRing(mem); err != nil {
				return fmt.Errorf("ReleaseRecvRing: %v", err)
			}
			return c.B.ReleaseRecvRing(mem)
		}},
		{"no memory to share for receiving", func(t *testing.T, c Carriers) error {
			_, _, err := c.B.ShareRecvRing(c.MakerB, nil)
			return err
		}},
		{"no memory to share for sending", func(t *testing.T, c Carriers) error {
			_, err := c.A.ShareSendRing(c.MakerA, []byte{})
			return err
		}},
		{"receive ring shared twice", func(t *testing.T, c Carriers) error {
			mem, _, _ := ShareRecv(t, c.B, c.MakerB, 100)
			_, _, err := c.B.ShareRecvRing(c.MakerB, mem)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := pair(t, DefaultSpec(), DefaultSpec())
			if err := tc.do(t, c); !errors.Is(err, link.ErrMisuse) {
				t.Fatalf("got %v, want an error matching link.ErrMisuse", err)
			}
			// Nothing was posted: a control message is the only arrival,
			// and its completion the only one.
			Post(t, c.A, Control(7, 0))
			WantKinds(t, "b", WaitFor(t, c.B, 1), "control-arrived")
			WantKinds(t, "a", WaitFor(t, c.A, 1), "send-done 7")
			if cs := append(PollAll(t, c.A), PollAll(t, c.B)...); len(cs) != 0 {
				t.Errorf("more completions: %q", Kinds(cs))
			}
		})
	}
}

// Data into a receive ring the peer released, or named by one ring's key
// and another's address, fails both ends with link.ErrRemoteAccess after
// what came before it, as a wrong key does.
func testRemoteAccessAcrossRings(t *testing.T, pair MakeCarrierPair, opts Options) {
	type rings struct {
		key          uint32
		r1, r2       []byte
		addr1, addr2 uint64
		rkey1, rkey2 uint32
	}
	for _, tc := range []struct {
		name string
		// bad releases what it needs and returns the request that fails.
		bad func(t *testing.T, c Carriers, r *rings) link.SendWR
		// zero: bad writes zero bytes (under ZeroLengthUnchecked it
		// lands nowhere, and arrives as what it is).
		zero []string
	}{
		{"released ring", func(t *testing.T, c Carriers, r *rings) link.SendWR {
			if err := c.B.ReleaseRecvRing(r.r1); err != nil {
				t.Fatal(err)
			}
			return Tagged(r.key, 0, 10, r.addr1, r.rkey1, 2, true, 2)
		}, nil},
		{"released first ring", func(t *testing.T, c Carriers, r *rings) link.SendWR {
			if err := c.B.ReleaseRecvRing(c.B.RecvRing()); err != nil {
				t.Fatal(err)
			}
			addr, rkey := c.B.RecvRingKey()
			return Tagged(r.key, 0, 10, addr+100, rkey, 2, true, 2)
		}, nil},
		{"marker into a released ring", func(t *testing.T, c Carriers, r *rings) link.SendWR {
			if err := c.B.ReleaseRecvRing(r.r1); err != nil {
				t.Fatal(err)
			}
			return link.SendWR{Kind: link.SendMarker, Signaled: true, ID: 2, Remote: r.addr1, RKey: r.rkey1}
		}, []string{}},
		{"zero bytes into a released ring", func(t *testing.T, c Carriers, r *rings) link.SendWR {
			if err := c.B.ReleaseRecvRing(r.r1); err != nil {
				t.Fatal(err)
			}
			return Tagged(r.key, 0, 0, r.addr1, r.rkey1, 2, true, 2)
		}, []string{"data-arrived 0"}},
		{"another ring's address", func(t *testing.T, c Carriers, r *rings) link.SendWR {
			return Tagged(r.key, 0, 10, r.addr2, r.rkey1, 2, true, 2)
		}, nil},
		{"past the ring", func(t *testing.T, c Carriers, r *rings) link.SendWR {
			return Tagged(r.key, 0, 10, r.addr1+uint64(len(r.r1))-9, r.rkey1, 2, true, 2)
		}, nil},
		{"released ring, another one shared", func(t *testing.T, c Carriers, r *rings) link.SendWR {
			if err := c.B.ReleaseRecvRing(r.r1); err != nil {
				t.Fatal(err)
			}
			ShareRecv(t, c.B, c.MakerB, len(r.r1))
			return Tagged(r.key, 0, 10, r.addr1, r.rkey1, 2, true, 2)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := pair(t, DefaultSpec(), DefaultSpec())
			a, b := c.A, c.B
			var r rings
			var smem []byte
			smem, r.key = ShareSend(t, a, c.MakerA, 100)
			Fill(smem, 1)
			r.r1, r.addr1, r.rkey1 = ShareRecv(t, b, c.MakerB, 1000)
			r.r2, r.addr2, r.rkey2 = ShareRecv(t, b, c.MakerB, 1000)
			Post(t, a, Tagged(r.key, 0, 10, r.addr1, r.rkey1, 1, true, 1))
			WantKinds(t, "b", WaitFor(t, b, 1), "data-arrived 10")
			WantKinds(t, "a", WaitFor(t, a, 1), "send-done 1")
			before := bytes.Clone(r.r1)
			bad := tc.bad(t, c, &r)
			Post(t, a, Tagged(r.key, 0, 10, r.addr2, r.rkey2, 3, true, 3), bad, Tagged(r.key, 0, 10, r.addr2, r.rkey2, 4, true, 4))
			if tc.zero != nil && opts.ZeroLengthUnchecked {
				WantKinds(t, "a", WaitFor(t, a, 3), "send-done 3", "send-done 2", "send-done 4")
				want := append(append([]string{"data-arrived 10"}, tc.zero...), "data-arrived 10")
				WantKinds(t, "b", WaitFor(t, b, len(want)), want...)
			} else {
				remoteAccessEnd(t, opts, a, b, []string{"send-done 3"}, []string{"data-arrived 10"})
			}
			if !bytes.Equal(r.r1, before) {
				t.Error("the ring the failed request named changed")
			}
		})
	}
}

// remoteAccessEnd checks that a request of a's failed both ends with a
// remote access error, after aFirst at a and bFirst at b.
func remoteAccessEnd(t *testing.T, opts Options, a, b link.Link, aFirst, bFirst []string) {
	t.Helper()
	if opts.RefusalEnds {
		// The refused request and the one after it may complete.
		RefusedEndAtSender(t, "a", WaitEnd(t, a), link.ErrRemoteAccess, aFirst, "send-done 2", "send-done 4", "send-done 5")
		RefusedEnd(t, "b", WaitEnd(t, b), link.ErrRemoteAccess, bFirst)
		return
	}
	ca := WaitFor(t, a, len(aFirst)+1)
	WantKinds(t, "a", ca, append(aFirst, "failed")...)
	cb := WaitFor(t, b, len(bFirst)+1)
	WantKinds(t, "b", cb, append(bFirst, "failed")...)
	for who, c := range map[string]link.Completion{"a": ca[len(ca)-1], "b": cb[len(cb)-1]} {
		if !errors.Is(c.Err, link.ErrRemoteAccess) || errors.Is(c.Err, link.ErrDown) {
			t.Errorf("%s's error: %v, want a remote access error", who, c.Err)
		}
	}
	if cs := append(PollAll(t, a), PollAll(t, b)...); len(cs) != 0 {
		t.Errorf("completions after the failure: %q", Kinds(cs))
	}
}
