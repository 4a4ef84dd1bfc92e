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
