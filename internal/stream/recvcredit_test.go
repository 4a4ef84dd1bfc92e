package stream

import (
	"errors"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// newIWARPEngine is an engine on a link with receive credit (and, if
// passive, speaking second), whose peer keeps peerDepth receives posted.
func newIWARPEngine(t *testing.T, peerDepth uint16, passive bool, ka time.Duration) (*Engine, *recorder, *clock) {
	t.Helper()
	const ring = 64 << 10
	clk := &clock{now: time.Unix(1000, 0)}
	e, err := New(Config{
		Features: wire.FeatureRing | wire.FeatureShutdown, PeerHello: true,
		Peer:     wire.Hello{Version: 1, Features: wire.FeatureRing | wire.FeatureShutdown, RecvDepth: peerDepth, RingSize: ring},
		Caps:     link.Caps{SendDepth: 64, RecvDepth: 16, ControlDepth: 4, RecvCredit: true, SpeakSecond: passive},
		SendRing: make([]byte, ring), RecvRing: make([]byte, ring), RecvAddr: 0x1000, RecvKey: 7,
		KeepAlive: ka, Clock: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	e.Start()
	e.Flush(r)
	return e, r, clk
}

// messages counts the requests that consume a receive at the peer.
func messages(wrs []link.SendWR) int {
	n := 0
	for _, wr := range wrs {
		if wr.Kind != link.SendMarker {
			n++
		}
	}
	return n
}

// TestEngineSpeaksSecond: the passive end of an iWARP link posts nothing,
// not even its announcement, until the active end's first message arrives.
func TestEngineSpeaksSecond(t *testing.T) {
	e, r, _ := newIWARPEngine(t, 16, true, 0)
	if len(r.sent) != 0 {
		t.Fatalf("posted %d requests before the peer spoke", len(r.sent))
	}
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 64 << 10, RKey: 9})
	e.Flush(r)
	if len(r.sent) != 1 || r.sent[0].Kind != link.SendControl {
		t.Fatalf("after the peer's first message posted %+v, want the announcement", r.sent)
	}
}

// TestEngineRecvCredit: with receive credit, data never takes the peer's
// last recvCreditReserve receives, whatever completes; the peer's Credit
// gives them back; and the engine returns credit itself once it posted
// again a quarter of its receives.
func TestEngineRecvCredit(t *testing.T) {
	const peerDepth = 16
	e, r, _ := newIWARPEngine(t, peerDepth, false, 0)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 64 << 10, RKey: 9})
	e.Flush(r)
	sent := 0 // counted as they complete; the announcement is first
	buf := make([]byte, 100)
	for range 100 {
		e.Write(buf)
		e.Flush(r)
		sent += messages(r.sent)
		completeAll(e, r) // completions free slots, not receive credit
		e.Flush(r)
	}
	sent += messages(r.sent)
	completeAll(e, r)
	if want := peerDepth - recvCreditReserve; sent != want {
		t.Fatalf("%d messages sent without credit back, want %d (the peer's %d receives less the reserve)", sent, want, peerDepth)
	}
	if e.Writable() {
		t.Fatal("Writable with no credit for data")
	}
	// The peer posted again what it took.
	control(e, wire.Message{Op: wire.OpCredit, Receives: uint32(sent)})
	e.Flush(r)
	if !e.Writable() {
		t.Fatal("not Writable after the peer's Credit")
	}

	// This side's receives: a Credit goes once a quarter of its 16 were
	// posted again, counting those of the two messages that came so far
	// (the announcement and the Credit).
	r.sent = r.sent[:0]
	for again := 3; again <= 8; again++ {
		e.Handle(&link.Completion{Kind: link.DataArrived, N: 1})
		e.AfterCompletions()
		e.Flush(r)
		var credits []uint32
		for _, wr := range r.sent {
			if m, _ := wire.Decode(wr.Msg[:], true); wr.Kind == link.SendControl && m.Op == wire.OpCredit {
				credits = append(credits, m.Receives)
			}
		}
		completeAll(e, r)
		switch {
		case (again == 4 || again == 8) && (len(credits) != 1 || credits[0] != uint32(again)):
			t.Fatalf("after %d receives posted again, Credits %v, want one reporting %d", again, credits, again)
		case again != 4 && again != 8 && len(credits) != 0:
			t.Fatalf("after %d receives posted again, Credits %v, want none", again, credits)
		}
	}

	// A peer reporting receives for messages never sent is hostile.
	control(e, wire.Message{Op: wire.OpCredit, Receives: uint32(sent + 100)})
	if !errors.Is(e.Err(), wire.ErrProtocol) {
		t.Fatalf("credit beyond what was sent: %v, want a protocol error", e.Err())
	}
}

// TestEngineRecvCreditDepth: receive credit needs a few receives each way.
func TestEngineRecvCreditDepth(t *testing.T) {
	_, err := New(Config{
		Features: wire.FeatureRing, PeerHello: true,
		Peer:     wire.Hello{Version: 1, Features: wire.FeatureRing, RecvDepth: 4, RingSize: 4096},
		Caps:     link.Caps{SendDepth: 8, RecvDepth: 16, ControlDepth: 2, RecvCredit: true},
		SendRing: make([]byte, 4096), RecvRing: make([]byte, 4096),
	})
	if !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("receive credit with a peer keeping 4 receives: %v, want a protocol error", err)
	}
}

// TestEngineRecvCreditLiveness: on a link whose completions prove nothing,
// a side that heard nothing for KeepAlive asks (Keepalive), the peer
// answers a Keepalive with a Credit, and a peer silent for twice
// KeepAlive is a dead path although every send completed.
func TestEngineRecvCreditLiveness(t *testing.T) {
	const ka = time.Second
	e, r, clk := newIWARPEngine(t, 16, false, ka)
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 64 << 10, RKey: 9})
	e.Flush(r)

	control(e, wire.Message{Op: wire.OpKeepalive})
	e.Flush(r)
	if len(r.sent) != 1 {
		t.Fatalf("answer to a Keepalive: %d requests, want a Credit", len(r.sent))
	}
	if m, _ := wire.Decode(r.sent[0].Msg[:], true); m.Op != wire.OpCredit {
		t.Fatalf("answer to a Keepalive: %v, want Credit", m.Op)
	}
	completeAll(e, r)

	clk.advance(ka)
	e.Tick()
	e.Flush(r)
	if len(r.sent) != 1 {
		t.Fatalf("after %v without a word from the peer: %d requests, want a Keepalive", ka, len(r.sent))
	}
	completeAll(e, r) // the send completes: it proves nothing here
	clk.advance(ka)
	e.Tick()
	var dead *PathDeadError
	if !errors.As(e.Err(), &dead) {
		t.Fatalf("after %v without a word from the peer: %v, want a dead path", 2*ka, e.Err())
	}
}

// granter is a test's link with a receive pool: Grant answers what give
// says, and records what it was asked.
type granter struct {
	*recorder
	give  func(held, n int) int
	asked [][2]int
}

func (g *granter) Grant(held, n int) int {
	g.asked = append(g.asked, [2]int{held, n})
	return g.give(held, n)
}

// newGrantingEngine is newIWARPEngine's engine with credit grants agreed,
// a first grant of first, on a link that grants as give says.
func newGrantingEngine(t *testing.T, first int, give func(held, n int) int) (*Engine, *granter) {
	t.Helper()
	const ring = 64 << 10
	e, err := New(Config{
		Features: wire.FeatureRing | wire.FeatureShutdown, PeerHello: true,
		Peer:     wire.Hello{Version: 1, Features: wire.FeatureRing | wire.FeatureShutdown, RecvDepth: 16, RingSize: ring},
		Caps:     link.Caps{SendDepth: 64, RecvDepth: first, ControlDepth: 4, RecvCredit: true, RecvGrant: true},
		SendRing: make([]byte, ring), RecvRing: make([]byte, ring), RecvAddr: 0x1000, RecvKey: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	g := &granter{recorder: &recorder{}, give: give}
	e.Start()
	e.Flush(g)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: ring, RKey: 9})
	e.Flush(g)
	return e, g
}

// credits are the Receives of the Credits posted since the last look.
func credits(e *Engine, g *granter) []uint32 {
	var out []uint32
	for _, wr := range g.sent {
		if m, _ := wire.Decode(wr.Msg[:], true); wr.Kind == link.SendControl && m.Op == wire.OpCredit {
			out = append(out, m.Receives)
		}
	}
	completeAll(e, g.recorder)
	return out
}

// TestEngineRecvGrant: a receiver whose link grants (link.RecvGranter)
// gives back what the pool says, with the peer's credit never under the
// first grant nor over maxGranted, and says so in its Credits.
func TestEngineRecvGrant(t *testing.T) {
	const first = 8
	arrive := func(e *Engine, g *granter, n int) {
		for range n {
			e.Handle(&link.Completion{Kind: link.DataArrived, N: 1})
		}
		e.AfterCompletions()
		e.Flush(g)
	}
	// A pool with room doubles what a streaming link took. The
	// announcement took the first receive: 2 given back, the peer holds 9,
	// and no Credit is due for less than half the first grant (one message
	// made one due before, and Credits answered Credits).
	e, g := newGrantingEngine(t, first, func(held, n int) int { return 2 * n })
	if got := credits(e, g); len(got) != 0 {
		t.Fatalf("Credits %v after the announcement, want none: 2 unreported of the peer's 9", got)
	}
	arrive(e, g, 4)
	if got := credits(e, g); len(got) != 1 || got[0] != 2+8 {
		t.Fatalf("Credits %v after 4 receives taken and 8 granted, want [10]", got)
	}
	if last := g.asked[len(g.asked)-1]; last != [2]int{9 - 4, 4} {
		t.Fatalf("Grant asked with held %d, n %d; want 5 and 4", last[0], last[1])
	}
	// The pool is short: it gives nothing back, but the peer keeps its
	// first grant. It held 13; 12 taken leave 1, and 7 go back.
	g.give = func(held, n int) int { return 0 }
	arrive(e, g, 12)
	if got := credits(e, g); len(got) != 1 || got[0] != 10+7 {
		t.Fatalf("Credits %v after 12 taken from 13 with a pool that gives nothing, want [17] (back to the first grant of %d)", got, first)
	}
	// A pool that would give past maxGranted gives up to it: the peer held
	// 8, 1 taken leaves 7.
	g.give = func(held, n int) int { return 1 << 20 }
	arrive(e, g, 1)
	if got := credits(e, g); len(got) != 1 || got[0] != 17+maxGranted-7 {
		t.Fatalf("Credits %v from a pool giving 2^20, want %d: the peer held at %d", got, 17+maxGranted-7, maxGranted)
	}
	if e.Err() != nil {
		t.Fatal(e.Err())
	}

	// A peer that sends beyond what it holds takes other links' receives.
	e, g = newGrantingEngine(t, first, func(held, n int) int { return n })
	credits(e, g)
	arrive(e, g, first+1)
	if !errors.Is(e.Err(), wire.ErrProtocol) {
		t.Fatalf("%d messages on a credit of %d: %v, want a protocol error", first+1, first, e.Err())
	}
}

// TestEngineTakesGrants: with grants agreed, a peer's Credit may give more
// than this side's messages took, up to maxGranted held; without them, or
// beyond it, that is a protocol error.
func TestEngineTakesGrants(t *testing.T) {
	e, g := newGrantingEngine(t, 8, func(held, n int) int { return n })
	buf := make([]byte, 100)
	for range 100 {
		e.Write(buf)
		e.Flush(g)
		completeAll(e, g.recorder)
	}
	if e.Writable() {
		t.Fatal("Writable with no credit from the peer")
	}
	// 16 receives at the peer, 13 messages sent: a grant of 100 beyond
	// them.
	control(e, wire.Message{Op: wire.OpCredit, Receives: 13 + 100})
	e.Flush(g)
	if e.Err() != nil || !e.Writable() {
		t.Fatalf("after a grant beyond the messages sent: writable %v, %v", e.Writable(), e.Err())
	}
	control(e, wire.Message{Op: wire.OpCredit, Receives: maxGranted + 50})
	if !errors.Is(e.Err(), wire.ErrProtocol) {
		t.Fatalf("a grant past %d held: %v, want a protocol error", maxGranted, e.Err())
	}

	// Without grants, the same first Credit is hostile.
	e, r, _ := newIWARPEngine(t, 16, false, 0)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 64 << 10, RKey: 9})
	e.Flush(r)
	control(e, wire.Message{Op: wire.OpCredit, Receives: 100})
	if !errors.Is(e.Err(), wire.ErrProtocol) {
		t.Fatalf("credit beyond the messages sent without grants: %v, want a protocol error", e.Err())
	}
}

// TestEngineGrantsSignalByOwnDepth: with grants, the peer's first grant
// (its Hello's RecvDepth, 16 here; a group stream's 8) bounds nothing but
// the credit, which grows: the send queue is the link's own depth, and a
// request and answer exchange signals a data write every quarter of it,
// not every quarter of the first grant (a group stream's round trip took
// a send completion each).
func TestEngineGrantsSignalByOwnDepth(t *testing.T) {
	const depth = 64 // newGrantingEngine's Caps.SendDepth
	e, g := newGrantingEngine(t, 8, func(held, n int) int { return n })
	completeAll(e, g.recorder)
	// The peer grants well beyond its first receives.
	control(e, wire.Message{Op: wire.OpCredit, Receives: 200})
	const exchanges = 60
	buf := make([]byte, 64)
	signaled := 0
	for i := range exchanges {
		if n, err := e.Write(buf); n != len(buf) || err != nil {
			t.Fatalf("exchange %d: Write: %d, %v", i, n, err)
		}
		e.Flush(g)
		for _, wr := range g.sent {
			if wr.Kind == link.SendData && wr.Signaled {
				signaled++
			}
		}
		completeAll(e, g.recorder)
		// The answer.
		e.Handle(&link.Completion{Kind: link.DataArrived, N: uint32(len(buf))})
		e.AfterCompletions()
		if n, err := e.Read(buf); n != len(buf) || err != nil {
			t.Fatalf("exchange %d: Read: %d, %v", i, n, err)
		}
		e.Flush(g)
		completeAll(e, g.recorder)
	}
	if e.Err() != nil {
		t.Fatal(e.Err())
	}
	if most := exchanges/(depth/4) + 1; signaled > most {
		t.Errorf("%d of %d data writes signaled, want at most %d: one every %d requests of the send queue's %d",
			signaled, exchanges, most, depth/4, depth)
	}
}
