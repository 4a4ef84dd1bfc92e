package stream

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Rings that follow traffic (grow.go), over link.Pipe driven by hand: two
// engines that start with small rings, stream both ways with random Reads
// and Writes, grow their rings, go idle and shrink them, and stream again.
// Every byte must arrive once, in order, and no ring may be given back
// while the peer can still write into it or this side still reads it
// (the pipe poisons a ring given back and refuses writes into it).

const growFeatures = wire.FeatureRing | wire.FeatureShutdown | wire.FeatureGrow

type growSide struct {
	eng     *Engine
	link    *link.Pipe
	src     []byte
	sent    int
	got     bytes.Buffer
	eof     bool
	maxRecv uint64 // the largest receive ring seen
	maxSend uint64
}

type growPair struct {
	a, b     *growSide
	clk      *clock
	features wire.Features
}

// newGrowPair makes two engines over a pipe with first rings of first
// bytes, growing to most; ringLimit bounds each end's extra rings.
func newGrowPair(t *testing.T, features wire.Features, first, most, ringLimit int) *growPair {
	t.Helper()
	cfg := link.PipeConfig{SendRing: first, RecvRing: first, SendDepth: 16, RecvDepth: 16, ControlDepth: 4, RNRRetry: 7, RingLimit: ringLimit}
	la, lb := link.NewPipe(cfg, cfg)
	p := &growPair{a: &growSide{link: la}, b: &growSide{link: lb}, clk: &clock{now: time.Unix(1000, 0)}, features: features}
	for _, s := range []*growSide{p.a, p.b} {
		addr, key := s.link.RecvRingKey()
		hello := wire.Hello{Version: 1, Features: features, RecvDepth: 16, RingSize: uint32(first)}
		e, err := New(Config{
			Features: features, Peer: hello, PeerHello: features != 0, Server: s == p.b,
			Caps: s.link.Caps(), SendRing: s.link.SendRing(), RecvRing: s.link.RecvRing(), RecvAddr: addr, RecvKey: key,
			MaxSendRing: most, MaxRecvRing: most, ShrinkAfter: 5 * time.Second,
			KeepAlive: time.Hour, Clock: p.clk.Now,
		})
		if err != nil {
			t.Fatal(err)
		}
		s.eng = e
		e.Start()
		e.Flush(s.link)
	}
	return p
}

func (s *growSide) poll(t *testing.T) bool {
	var cs [8]link.Completion
	n, err := s.link.Poll(cs[:])
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	for i := range cs[:n] {
		s.eng.Handle(&cs[i])
	}
	s.eng.AfterCompletions()
	s.eng.Flush(s.link)
	return n > 0
}

// step polls, reads and (if write) writes a random amount.
func (s *growSide) step(t *testing.T, rng *rand.Rand, buf []byte, write bool) {
	s.poll(t)
	if k, err := s.eng.Read(buf[:1+rng.IntN(len(buf))]); k > 0 {
		s.got.Write(buf[:k])
	} else if err == io.EOF {
		s.eof = true
	} else if err != nil && err != ErrWouldBlock {
		t.Fatalf("read: %v", err)
	}
	if write && s.sent < len(s.src) {
		end := min(len(s.src), s.sent+1+rng.IntN(40_000))
		k, err := s.eng.Write(s.src[s.sent:end])
		s.sent += k
		if err != nil && err != ErrWouldBlock {
			t.Fatalf("write: %v", err)
		}
	}
	s.eng.Flush(s.link)
	st := s.eng.State()
	s.maxRecv, s.maxSend = max(s.maxRecv, st.RecvRing), max(s.maxSend, st.SendRing)
	if err := s.eng.Err(); err != nil {
		t.Fatalf("engine failed: %v", err)
	}
}

// run streams until both sides sent n more bytes and the other read them.
func (p *growPair) run(t *testing.T, rng *rand.Rand, n int) {
	t.Helper()
	buf := make([]byte, 64<<10)
	for _, s := range []*growSide{p.a, p.b} {
		s.src = append(s.src, randomBytes(rng, n)...)
	}
	for steps := 0; p.a.sent < len(p.a.src) || p.b.sent < len(p.b.src) ||
		p.a.got.Len() < len(p.b.src) || p.b.got.Len() < len(p.a.src); steps++ {
		if steps > 1_000_000 {
			t.Fatalf("stuck: a sent %d got %d, b sent %d got %d", p.a.sent, p.a.got.Len(), p.b.sent, p.b.got.Len())
		}
		p.clk.advance(time.Millisecond)
		p.a.step(t, rng, buf, true)
		p.b.step(t, rng, buf, true)
	}
}

// idle lets time pass with nothing to send, ticking, for longer than ShrinkAfter.
func (p *growPair) idle(t *testing.T, rng *rand.Rand) {
	buf := make([]byte, 1024)
	for range 20 {
		p.clk.advance(time.Second)
		for _, s := range []*growSide{p.a, p.b} {
			s.eng.Tick()
			s.eng.Flush(s.link)
			s.step(t, rng, buf, false)
		}
	}
}

func (p *growPair) check(t *testing.T) {
	t.Helper()
	if sha256.Sum256(p.a.got.Bytes()) != sha256.Sum256(p.b.src) || sha256.Sum256(p.b.got.Bytes()) != sha256.Sum256(p.a.src) {
		t.Fatalf("bytes differ: a got %d of %d (prefix %v), b got %d of %d (prefix %v)",
			p.a.got.Len(), len(p.b.src), bytes.HasPrefix(p.b.src, p.a.got.Bytes()),
			p.b.got.Len(), len(p.a.src), bytes.HasPrefix(p.a.src, p.b.got.Bytes()))
	}
}

func TestRingsGrowAndShrinkMidStream(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 24))
			const first, most = 4 << 10, 64 << 10
			p := newGrowPair(t, growFeatures, first, most, 0)
			p.run(t, rng, 600_000)
			p.check(t)
			for _, s := range []*growSide{p.a, p.b} {
				if s.maxRecv != most || s.maxSend != most {
					t.Fatalf("rings grew to %d (receive) and %d (send), want %d", s.maxRecv, s.maxSend, most)
				}
			}
			p.idle(t, rng)
			for _, s := range []*growSide{p.a, p.b} {
				if st := s.eng.State(); st.RecvRing != first || st.SendRing != first {
					t.Fatalf("idle rings %d (receive) and %d (send), want %d back", st.RecvRing, st.SendRing, first)
				}
			}
			// And again: they grow back, and the bytes stay whole.
			p.a.maxRecv, p.a.maxSend = 0, 0
			p.run(t, rng, 600_000)
			p.check(t)
			if p.a.maxRecv != most {
				t.Fatalf("after shrinking the receive ring grew to %d, want %d", p.a.maxRecv, most)
			}
			st := p.b.link.Stats()
			// At least twice each way: a ring full of unread bytes goes to
			// the largest at once, in one step.
			if st.RingsMade < 3 || st.RingsReleased < 3 {
				t.Fatalf("pipe made %d rings and got %d back: the test did not replace rings", st.RingsMade, st.RingsReleased)
			}
		})
	}
}

// A pool that runs dry leaves the connection on the rings it has.
func TestRingsStayWhenThePoolIsDry(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 24))
	p := newGrowPair(t, growFeatures, 4<<10, 256<<10, 24<<10)
	p.run(t, rng, 400_000)
	p.check(t)
	st := p.a.link.Stats()
	if st.RingsRefused == 0 {
		t.Fatalf("no ring was refused: the test did not run the pool dry")
	}
	if p.a.maxRecv >= 256<<10 {
		t.Fatalf("receive ring reached %d bytes past the pool's limit", p.a.maxRecv)
	}
}

// In Valkey's protocol the buffer grows when the peer wrapped, and the
// peer (a SendWindow) takes the new one as any re-announcement.
func TestValkeyBufferGrowsAtAWrap(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 24))
	p := newGrowPair(t, 0, 4<<10, 32<<10, 0)
	p.run(t, rng, 300_000)
	p.check(t)
	if p.a.maxRecv != 32<<10 || p.b.maxRecv != 32<<10 {
		t.Fatalf("buffers grew to %d and %d, want %d", p.a.maxRecv, p.b.maxRecv, 32<<10)
	}
	p.idle(t, rng)
	if st := p.a.eng.State(); st.RecvRing != 32<<10 {
		t.Fatalf("Valkey's buffer shrank to %d: it never may", st.RecvRing)
	}
}

// Ring and RingAt that break the rules end the stream with a protocol error.
func TestRingMessagesFromAHostilePeer(t *testing.T) {
	hello := wire.Hello{Version: 1, Features: growFeatures, RecvDepth: 64, RingSize: 4096}
	offer := wire.Message{Op: wire.OpRing, Addr: 0x9000, Length: 8192, RKey: 5}
	for _, c := range []struct {
		name     string
		features wire.Features
		msgs     []wire.Message
	}{
		{"Ring without the extension", wire.FeatureRing, []wire.Message{offer}},
		{"Ring before the ring", growFeatures, []wire.Message{offer}},
		{"Ring over 1 GiB", growFeatures, []wire.Message{{Op: wire.OpRegisterXferMemory, Addr: 0x1000, Length: 4096, RKey: 1}, {Op: wire.OpRing, Addr: 1, Length: 1<<30 + 1}}},
		{"Ring of 0 bytes", growFeatures, []wire.Message{{Op: wire.OpRegisterXferMemory, Addr: 0x1000, Length: 4096, RKey: 1}, {Op: wire.OpRing, Addr: 1}}},
		{"RingAt without an offer", growFeatures, []wire.Message{{Op: wire.OpRingAt}}},
		{"Retain without the extension", growFeatures, []wire.Message{{Op: wire.OpRetain, Length: 8192}}},
		{"Retain of 0 bytes", growFeatures | wire.FeatureRetain, []wire.Message{{Op: wire.OpRetain}}},
		{"Retain over 1 GiB", growFeatures | wire.FeatureRetain, []wire.Message{{Op: wire.OpRetain, Length: 1<<30 + 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := hello
			h.Features = c.features
			e, _, _ := newTestEngine(t, c.features, h, 0)
			for _, m := range c.msgs {
				control(e, m)
			}
			if !errors.Is(e.Err(), wire.ErrProtocol) {
				t.Fatalf("err = %v, want a protocol error", e.Err())
			}
		})
	}
}

// The sender switches rings only once every byte before the switch is
// posted: on a link with receive credit, bytes may be held for credit
// while a control message still may go, and RingAt must wait for them.
func TestRingAtFollowsHeldBytes(t *testing.T) {
	clk := &clock{now: time.Unix(1000, 0)}
	peer := wire.Hello{Version: 1, Features: growFeatures, RecvDepth: 8, RingSize: 4096}
	e, err := New(Config{
		Features: growFeatures, Peer: peer, PeerHello: true,
		Caps:     link.Caps{SendDepth: 64, RecvDepth: 16, ControlDepth: 4, RecvCredit: true},
		SendRing: make([]byte, 4096), RecvRing: make([]byte, 4096), RecvAddr: 0x1000, RecvKey: 7,
		Clock: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	e.Start()
	e.Flush(r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x100000, Length: 4096, RKey: 9})
	e.Flush(r)
	var all []link.SendWR
	take := func() {
		all = append(all, r.sent...)
		completeAll(e, r)
		e.Flush(r)
	}
	take()
	// Spend the peer's receives down to one more than data leaves to
	// control messages.
	for i := 0; e.rc.available() > recvCreditReserve+2; i++ {
		if i > 100 {
			t.Fatal("receive credit never went down")
		}
		if _, err := e.Write(make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		e.Flush(r)
		take()
	}
	var pending []link.SendWR // posted and not completed, in order
	keepalive := func() {
		e.ctl.want |= wantKeepalive
		e.flushControl()
		e.Flush(r)
		all = append(all, r.sent...)
		pending = append(pending, r.sent...)
		r.sent = r.sent[:0]
	}
	// A keepalive in flight: small Writes are held behind it. Then another
	// takes the last receive data may use.
	keepalive()
	if _, err := e.Write(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	keepalive()
	if e.sq.Held() == 0 || e.rc.canData() {
		t.Fatalf("held %d bytes, data credit %v: the test tests nothing", e.sq.Held(), e.rc.canData())
	}
	control(e, wire.Message{Op: wire.OpRing, Addr: 0x200000, Length: 8192, RKey: 10})
	e.Flush(r)
	all = append(all, r.sent...)
	pending = append(pending, r.sent...)
	r.sent = r.sent[:0]
	for _, wr := range pending {
		if wr.Signaled {
			e.Handle(&link.Completion{Kind: link.SendDone, ID: wr.ID})
		}
	}
	// The peer posts its receives again.
	control(e, wire.Message{Op: wire.OpCredit, Receives: uint32(e.rc.sent)})
	e.Flush(r)
	take()
	var before uint64
	var at *wire.Message
	for _, wr := range all {
		switch wr.Kind {
		case link.SendData:
			if at == nil {
				before += uint64(wr.N)
				if wr.RKey != 9 {
					t.Fatalf("data before RingAt went to key %d", wr.RKey)
				}
			} else if wr.RKey != 10 {
				t.Fatalf("data after RingAt went to key %d, want the new ring's", wr.RKey)
			}
		case link.SendControl:
			if m, _ := wire.Decode(wr.Msg[:], true); m.Op == wire.OpRingAt {
				at = &m
			}
		}
	}
	if at == nil {
		t.Fatal("no RingAt sent")
	}
	if at.At != before {
		t.Fatalf("RingAt at %d; %d bytes were posted before it", at.At, before)
	}
}

// newWriterEngine is an engine with features whose transmit ring starts
// at 4 KiB and may grow to 256 KiB, toward a peer that announced a
// receive ring of peerRing bytes (and retains as much, resuming); r
// records what it posts, and makes rings.
func newWriterEngine(t *testing.T, features wire.Features, peerRing uint32) (*Engine, ringRecorder) {
	t.Helper()
	clk := &clock{now: time.Unix(1000, 0)}
	peer := wire.Hello{Version: 1, Features: features, RecvDepth: 64, RingSize: peerRing, SendRing: peerRing}
	e, err := New(Config{
		Features: features, Peer: peer, PeerHello: true,
		Caps:     link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4},
		SendRing: make([]byte, 4<<10), RecvRing: make([]byte, 16<<10), RecvAddr: 0x1000, RecvKey: 7,
		MaxSendRing: 256 << 10, MaxRecvRing: 16 << 10, Clock: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := ringRecorder{&recorder{}}
	e.Start()
	e.Flush(r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x100000, Length: peerRing, RKey: 9})
	completeAll(e, r.recorder)
	return e, r
}

// A Write larger than a quarter of the transmit ring grows it to four
// times the Write first, so that it goes as one data request.
func TestTransmitRingGrowsForALargeWrite(t *testing.T) {
	e, r := newWriterEngine(t, growFeatures, 64<<10)
	msg := make([]byte, 4<<10)
	written := 0
	for i := 0; written < len(msg); i++ {
		if i > 3 {
			t.Fatalf("the Write never went: %d bytes written", written)
		}
		n, err := e.Write(msg[written:])
		written += n
		if err != nil && err != ErrWouldBlock {
			t.Fatal(err)
		}
		e.Flush(r)
	}
	if st := e.State(); st.SendRing != 16<<10 {
		t.Fatalf("transmit ring of %d bytes after a 4 KiB Write, want 16 KiB", st.SendRing)
	}
	var data []link.SendWR
	for _, wr := range r.sent {
		if wr.Kind == link.SendData {
			data = append(data, wr)
		}
	}
	if len(data) != 1 || data[0].N != 4<<10 {
		t.Fatalf("the 4 KiB Write went as %+v, want one request", data)
	}
}

// A side that writes before it reads, to a peer that does not read yet,
// gets more than the first rings' worth out: the peer's receive ring grows
// to its largest when it is full of unread bytes, as a socket's buffer
// holds them. With 16 KiB rings the Writes would otherwise stop at 16 KiB
// (a Write takes no more than the peer's window), and two sides that both write a request
// of that size before reading would deadlock. Now they stop at the largest
// ring's worth, as before rings grew.
func TestReceiveRingGrowsForUnreadBytes(t *testing.T) {
	p := newGrowPair(t, growFeatures, 16<<10, 256<<10, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	a, b := p.a, p.b
	a.src = randomBytes(rng, 1<<20)
	for idle := 0; idle < 50 && a.sent < len(a.src); {
		p.clk.advance(time.Millisecond)
		a.poll(t)
		k, err := a.eng.Write(a.src[a.sent:])
		if err != nil && err != ErrWouldBlock {
			t.Fatal(err)
		}
		a.sent += k
		a.eng.Flush(a.link)
		moved := b.poll(t) // b takes completions, never reads
		if k == 0 && !moved {
			idle++
		} else {
			idle = 0
		}
	}
	// The full 16 KiB ring, then the largest beside it, less the 16 KiB
	// unread (bytes not credited count against the ring written).
	if a.sent < 256<<10 {
		t.Fatalf("a got %d bytes out to a peer that does not read, want 256 KiB; a %+v, b %+v", a.sent, a.eng.State(), b.eng.State())
	}
	t.Logf("%d bytes written before the peer read any (receive ring %d, transmit ring %d)", a.sent, b.eng.State().RecvRing, a.eng.State().SendRing)
	// Then b reads, and every byte arrives once, in order.
	p.b.src = randomBytes(rng, 1)
	buf := make([]byte, 64<<10)
	for steps := 0; b.got.Len() < len(a.src) || a.got.Len() < 1; steps++ {
		if steps > 1_000_000 {
			t.Fatalf("stuck: b got %d of %d", b.got.Len(), len(a.src))
		}
		p.clk.advance(time.Millisecond)
		a.step(t, rng, buf, true)
		b.step(t, rng, buf, true)
	}
	p.check(t)
}

// A reader that keeps up sees its receive ring grow four times at a step
// (4, 16, 64 KiB) while a stream arrives fast, never straight to the
// largest: only a ring full of unread bytes does that.
func TestReceiveRingGrowsInSteps(t *testing.T) {
	p := newGrowPair(t, growFeatures, 4<<10, 64<<10, 0)
	a, b := p.a, p.b
	chunk := make([]byte, 1<<10)
	buf := make([]byte, 64<<10)
	seen := map[uint64]bool{}
	for i := 0; i < 2000 && b.eng.State().RecvRing < 64<<10; i++ {
		p.clk.advance(time.Millisecond)
		a.poll(t)
		if _, err := a.eng.Write(chunk); err != nil && err != ErrWouldBlock {
			t.Fatal(err)
		}
		a.eng.Flush(a.link)
		b.poll(t)
		for {
			n, err := b.eng.Read(buf)
			if n == 0 || err != nil {
				break
			}
		}
		b.eng.Flush(b.link)
		seen[b.eng.State().RecvRing] = true
	}
	if !seen[4<<10] || !seen[16<<10] || !seen[64<<10] {
		t.Fatalf("receive ring sizes seen: %v, want 4, 16 and 64 KiB", seen)
	}
}

// TestGrownRingsWriteWhole: once rings that started small have grown,
// writes that divide the ring go as one request each, as over rings of
// that size from the start. Two phases could split every one: the
// receive ring grown at a position the writes do not divide (so it
// wrapped in the middle of a write), and Credits that ran from the one a
// ring switch sends (so the sender's room ended in the middle of one).
// Together they made 1.5 requests a write, and half the throughput.
func TestGrownRingsWriteWhole(t *testing.T) {
	const write, ring = 64 << 10, 256 << 10
	requestsPerWrite := func(first int) float64 {
		p := newGrowPair(t, wire.FeatureRing|wire.FeatureGrow, first, ring, 0)
		src := make([]byte, write)
		buf := make([]byte, 32<<10)
		writes, off, posted := 0, 0, uint64(0)
		for steps := 0; writes < 600; steps++ {
			if steps > 1_000_000 {
				t.Fatalf("first rings of %d: stuck after %d writes", first, writes)
			}
			p.clk.advance(time.Millisecond)
			p.a.poll(t)
			k, err := p.a.eng.Write(src[off:])
			if err != nil && err != ErrWouldBlock {
				t.Fatal(err)
			}
			if off += k; off == write {
				writes, off = writes+1, 0
				if writes == 100 { // grown by now
					posted = p.a.eng.State().Posted
				}
			}
			p.a.eng.Flush(p.a.link)
			p.b.poll(t)
			for {
				if k, _ := p.b.eng.Read(buf); k == 0 {
					break
				}
			}
			p.b.eng.Flush(p.b.link)
		}
		if st := p.a.eng.State(); st.SendRing != ring {
			t.Fatalf("first rings of %d: the transmit ring is %d bytes, want %d", first, st.SendRing, ring)
		}
		if st := p.b.eng.State(); st.RecvRing != ring {
			t.Fatalf("first rings of %d: the receive ring is %d bytes, want %d", first, st.RecvRing, ring)
		}
		return float64(p.a.eng.State().Posted-posted) / 500
	}
	fixed, grown := requestsPerWrite(ring), requestsPerWrite(16<<10)
	t.Logf("requests a %d-byte write: %.3f over fixed rings, %.3f over rings grown from 16 KiB", write, fixed, grown)
	if grown > fixed*1.02 {
		t.Fatalf("%.3f requests a write over grown rings, %.3f over fixed ones", grown, fixed)
	}
}

// noRings is a link that makes no rings (a group's TCP link).
type noRings struct{ *recorder }

func (noRings) NewRecvRing(int) ([]byte, uint64, uint32, error) {
	return nil, 0, 0, errors.New("test: this link makes no rings")
}
func (noRings) ReleaseRecvRing([]byte) error { return nil }
func (noRings) ReplaceSendRing(int) ([]byte, error) {
	return nil, errors.New("test: this link makes no rings")
}

// A resumable stream on a link that makes no rings stays on the rings it
// has; moved to one that does, its rings grow again (a group's stream back
// on RDMA from its TCP link).
func TestRingsGrowAgainAfterRelink(t *testing.T) {
	clk := &clock{now: time.Unix(1000, 0)}
	features := growFeatures | wire.FeatureResume
	peer := wire.Hello{Version: 1, Features: features, RecvDepth: 64, RingSize: 64 << 10, SendRing: 64 << 10}
	e, err := New(Config{
		Features: features, Peer: peer, PeerHello: true,
		Caps:     link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4},
		SendRing: make([]byte, 4<<10), RecvRing: make([]byte, 16<<10), RecvAddr: 0x1000, RecvKey: 7,
		MaxSendRing: 256 << 10, MaxRecvRing: 16 << 10, Clock: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	e.Start()
	e.Flush(noRings{rec})
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x100000, Length: 64 << 10, RKey: 9})
	completeAll(e, rec)
	var sent uint64
	// write writes 4 KiB, and the peer takes it and gives credit back.
	write := func(lk Poster) {
		t.Helper()
		msg := make([]byte, 4<<10)
		for written, i := 0, 0; written < len(msg); i++ {
			if i > 8 {
				t.Fatalf("the Write never went: %d bytes written (%v)", written, e.Err())
			}
			n, err := e.Write(msg[written:])
			written += n
			sent += uint64(n)
			if err != nil && err != ErrWouldBlock {
				t.Fatal(err)
			}
			e.Flush(lk)
			completeAll(e, rec)
			control(e, wire.Message{Op: wire.OpCredit, ConsumedBytes: sent, Receives: 1})
			e.Flush(lk)
		}
	}
	write(noRings{rec})
	write(noRings{rec})
	if st := e.State(); st.SendRing != 4<<10 {
		t.Fatalf("transmit ring of %d bytes on a link that makes none, want the first 4 KiB", st.SendRing)
	}
	e.Handle(&link.Completion{Kind: link.Failed, Err: link.ErrDown})
	e.AfterCompletions()
	if err := e.Relink(link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4}, 0x2000, 8); err != nil {
		t.Fatal(err)
	}
	rings := ringRecorder{rec}
	e.Flush(rings)
	completeAll(e, rec)
	control(e, wire.Message{Op: wire.OpResume, ReceivedBytes: sent, ConsumedBytes: sent})
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x100000, Length: 64 << 10, RKey: 10})
	write(rings)
	write(rings)
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	if st := e.State(); st.SendRing <= 4<<10 {
		t.Fatalf("transmit ring of %d bytes after the move to a link that makes rings, want it grown", st.SendRing)
	}
}

// A resumable stream keeps the bytes the peer has not acknowledged, and
// the peer's Credit comes only every quarter of its ring: a short answer
// (72 bytes, a Redis HELLO's) can wait for it until the peer reads more.
// A large Write after it grows the transmit ring at once, with those bytes
// moved into the new ring at their positions, to be sent again from there
// after a failover. Waiting for their Credit stalled the Write for good
// over a group's stream (go-redis's GET of 1 MiB after HELLO, in the lab).
func TestResumableRingGrowsWithUnacknowledgedBytes(t *testing.T) {
	e, r := newWriterEngine(t, growFeatures|wire.FeatureResume, 16<<10)

	answer := bytes.Repeat([]byte("HELLO 3 "), 9)
	if n, err := e.Write(answer); n != len(answer) || err != nil {
		t.Fatalf("Write of the answer: %d, %v", n, err)
	}
	e.Flush(r)
	completeAll(e, r.recorder)

	big := randomBytes(rand.New(rand.NewPCG(1, 2)), 1<<20)
	sent := uint64(len(answer))
	for written, i := 0, 0; written < len(big); i++ {
		if i > 1000 {
			t.Fatalf("the large Write stalled at %d of %d bytes: %+v", written, len(big), e.State())
		}
		n, err := e.Write(big[written:])
		written += n
		sent += uint64(n)
		if err != nil && err != ErrWouldBlock {
			t.Fatal(err)
		}
		e.Flush(r)
		completeAll(e, r.recorder)
		// The peer reads everything and credits every 4 KiB.
		if credit := sent / (4 << 10) * (4 << 10); credit > 0 {
			control(e, wire.Message{Op: wire.OpCredit, ConsumedBytes: credit, Receives: 1})
			e.Flush(r)
		}
	}
	if err := e.Err(); err != nil {
		t.Fatal(err)
	}
	st := e.State()
	if st.SendRing <= 4<<10 {
		t.Fatalf("transmit ring of %d bytes, want it grown for the large Write", st.SendRing)
	}
	// What the peer has not acknowledged is in the ring at its position,
	// ready to be sent again.
	from, n := e.sq.Kept()
	if n == 0 || from+n != sent {
		t.Fatalf("kept %d bytes from %d; %d were sent", n, from, sent)
	}
	stream := append(append([]byte(nil), answer...), big...)
	got := make([]byte, n)
	copyRing(got, e.cfg.SendRing, from, 0, n)
	if !bytes.Equal(got, stream[from:from+n]) {
		t.Fatalf("the ring's kept bytes %d..%d differ from the stream's", from, from+n)
	}
}

// TestRetainedRingGrowsWithTheRate: a resumable stream whose peer credits
// every quarter of its transmit ring (wire.FeatureRetain) grows the ring
// when a ring's worth was written within growPeriod, though no answer
// fills it (512-byte answers, each credited before the next): each quarter
// written draws a Credit. Written slower, or to a peer that credits by
// its own ring (no Retain), the ring keeps its size.
func TestRetainedRingGrowsWithTheRate(t *testing.T) {
	answers := func(features wire.Features, every time.Duration) uint64 {
		e, r := newWriterEngine(t, features, 64<<10)
		clk := &clock{now: time.Unix(2000, 0)}
		e.cfg.Clock = clk.Now
		answer := make([]byte, 512)
		sent := uint64(0)
		for i := range 2000 {
			clk.advance(every)
			n, err := e.Write(answer)
			if err == ErrWouldBlock {
				// The ring is replaced once what it holds completed.
				e.Flush(r)
				completeAll(e, r.recorder)
				n, err = e.Write(answer)
			}
			if n != len(answer) || err != nil {
				t.Fatalf("answer %d: %d, %v (%+v)", i, n, err, e.State())
			}
			sent += uint64(n)
			e.Flush(r)
			completeAll(e, r.recorder)
			control(e, wire.Message{Op: wire.OpCredit, ConsumedBytes: sent, Receives: uint32(i + 1)})
			e.Flush(r)
		}
		if err := e.Err(); err != nil {
			t.Fatal(err)
		}
		return e.State().SendRing
	}
	const retained = growFeatures | wire.FeatureResume | wire.FeatureRetain
	if ring := answers(retained, 100*time.Microsecond); ring != 256<<10 {
		t.Errorf("answers of 512 bytes every 100 µs, retained: a transmit ring of %d bytes, want it grown to its largest (256 KiB)", ring)
	}
	if ring := answers(retained, 300*time.Millisecond); ring != 4<<10 {
		t.Errorf("answers of 512 bytes every 300 ms, retained: a transmit ring of %d bytes, want its first 4 KiB", ring)
	}
	if ring := answers(growFeatures|wire.FeatureResume, 100*time.Microsecond); ring != 4<<10 {
		t.Errorf("answers of 512 bytes every 100 µs to a peer that credits by its own ring: a transmit ring of %d bytes, want its first 4 KiB", ring)
	}
}

// copyRing wraps at the end of either ring.
func TestCopyRingWraps(t *testing.T) {
	old := []byte("0123456789")
	dst := make([]byte, 16)
	// Positions 6..13 of a stream, from a ring of 10 (wrapping at 10) to
	// one of 16.
	copyRing(dst, old, 6, 6, 8)
	if want := "6789" + "0123"; string(dst[6:14]) != want {
		t.Fatalf("copied %q, want %q", dst[6:14], want)
	}
	// From a ring of 16 into one of 4: the destination wraps.
	small := make([]byte, 4)
	copyRing(small, dst, 7, 7, 4)
	// Positions 7, 8, 9, 10 are offsets 3, 0, 1, 2 there.
	if want := "8907"; string(small) != want {
		t.Fatalf("copied %q, want %q", small, want)
	}
}
