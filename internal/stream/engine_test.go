package stream

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// recorder is a Poster that keeps what an engine posts, for tests that play
// the link and the peer by hand.
type recorder struct {
	sent    []link.SendWR
	reposts int
	made    int // rings made, as a ringRecorder
}

func (r *recorder) PostSend(wrs []link.SendWR) error { r.sent = append(r.sent, wrs...); return nil }
func (r *recorder) PostRecv(n int) error             { r.reposts += n; return nil }

// ringRecorder is a recorder that makes rings.
type ringRecorder struct{ *recorder }

func (r ringRecorder) NewRecvRing(size int) ([]byte, uint64, uint32, error) {
	r.made++
	return make([]byte, size), uint64(r.made) << 32, uint32(r.made), nil
}
func (r ringRecorder) ReleaseRecvRing([]byte) error             { return nil }
func (r ringRecorder) ReplaceSendRing(size int) ([]byte, error) { return make([]byte, size), nil }

// clock is a test clock the engine reads.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }

// newTestEngine makes an engine as two rdmanet peers agree (ring and
// half-close) unless features says otherwise, with the peer's Hello.
func newTestEngine(t *testing.T, features wire.Features, peer wire.Hello, ka time.Duration) (*Engine, *recorder, *clock) {
	t.Helper()
	clk := &clock{now: time.Unix(1000, 0)}
	e, err := New(Config{
		Features: features, Peer: peer, PeerHello: peer.Version != 0, Server: true,
		Caps:     link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4},
		SendRing: make([]byte, 4096), RecvRing: make([]byte, 4096), RecvAddr: 0x1000, RecvKey: 7,
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

var rdmanetHello = wire.Hello{Version: 1, Features: wire.FeatureRing | wire.FeatureShutdown, RecvDepth: 64, RingSize: 4096}

// control delivers a control message from the peer.
func control(e *Engine, m wire.Message) {
	c := link.Completion{Kind: link.ControlArrived}
	m.Encode(&c.Msg)
	e.Handle(&c)
	e.AfterCompletions()
}

// completeAll completes every signaled request posted so far, in order.
func completeAll(e *Engine, r *recorder) {
	for _, wr := range r.sent {
		if wr.Signaled {
			e.Handle(&link.Completion{Kind: link.SendDone, ID: wr.ID})
		}
	}
	r.sent = r.sent[:0]
	e.AfterCompletions()
}

func TestEngineAnnouncesFirst(t *testing.T) {
	_, r, _ := newTestEngine(t, wire.FeatureRing, rdmanetHello, 0)
	if len(r.sent) != 1 || r.sent[0].Kind != link.SendControl || !r.sent[0].Signaled {
		t.Fatalf("after Start posted %+v, want one signaled control message", r.sent)
	}
	m, err := wire.Decode(r.sent[0].Msg[:], true)
	if err != nil || m.Op != wire.OpRegisterXferMemory || m.Addr != 0x1000 || m.Length != 4096 || m.RKey != 7 {
		t.Fatalf("first message %+v (%v), want RegisterXferMemory of the receive ring", m, err)
	}
}

// TestEngineHonoursPeerRecvDepth: a peer that keeps 2 receives posted never
// has more than 2 of this side's messages in flight, however much is
// written (writes of corkLimit and more are not coalesced: each chunk of
// the ring would be a request of its own).
func TestEngineHonoursPeerRecvDepth(t *testing.T) {
	const ring = 256 << 10
	for _, depth := range []uint16{2, 5, 1024} {
		e, err := New(Config{
			Features: wire.FeatureRing | wire.FeatureShutdown, PeerHello: true,
			Peer:     wire.Hello{Version: 1, Features: wire.FeatureRing, RecvDepth: depth, RingSize: ring},
			Caps:     link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4},
			SendRing: make([]byte, ring), RecvRing: make([]byte, 4096),
		})
		if err != nil {
			t.Fatal(err)
		}
		r := &recorder{}
		e.Start()
		control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: ring, RKey: 9})
		e.Flush(r)
		most := 0
		buf := make([]byte, ring)
		for round := 0; round < 20; round++ {
			if _, err := e.Write(buf); err != nil && err != ErrWouldBlock {
				t.Fatal(err)
			}
			e.Flush(r)
			most = max(most, len(r.sent))
			if len(r.sent) > int(depth) {
				t.Fatalf("depth %d, round %d: %d requests in flight", depth, round, len(r.sent))
			}
			completeAll(e, r)
			e.Flush(r)
			control(e, wire.Message{Op: wire.OpCredit, ConsumedBytes: e.send.(*SendRing).sent})
			e.Flush(r)
		}
		if want := min(int(depth), 64); most < min(want, 4) {
			t.Errorf("depth %d: at most %d requests in flight; the test never filled the peer", depth, most)
		}
	}
}

// TestEngineFeatureFlood: a peer that asks for the server's features faster
// than the answers can go out gets a protocol error, not unbounded memory.
func TestEngineFeatureFlood(t *testing.T) {
	e, r, _ := newTestEngine(t, 0, wire.Hello{}, 0)
	// Never complete the control sends: every control slot stays busy.
	for i := 0; i < 100 && e.Err() == nil; i++ {
		control(e, wire.Message{Op: wire.OpGetServerFeature})
		e.Flush(r)
	}
	if !errors.Is(e.Err(), wire.ErrProtocol) {
		t.Fatalf("after a flood of GetServerFeature: %v, want a protocol error", e.Err())
	}
	if e.ctl.featureReplies > maxFeatureReplies {
		t.Fatalf("%d replies owed, bound %d", e.ctl.featureReplies, maxFeatureReplies)
	}
}

// TestEngineAnswersFeatures: a Valkey client's GetServerFeature gets the
// same opcode back, with no features.
func TestEngineAnswersFeatures(t *testing.T) {
	e, r, _ := newTestEngine(t, 0, wire.Hello{}, 0)
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpGetServerFeature})
	e.Flush(r)
	if len(r.sent) != 1 {
		t.Fatalf("posted %d requests, want the answer", len(r.sent))
	}
	if m, _ := wire.Decode(r.sent[0].Msg[:], false); m.Op != wire.OpGetServerFeature || m.Features != 0 {
		t.Fatalf("answer %+v", m)
	}
}

func TestEngineHostileControl(t *testing.T) {
	cases := []struct {
		name     string
		features wire.Features
		m        wire.Message
	}{
		{"ring of the wrong size", wire.FeatureRing, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 8192, RKey: 1}},
		{"empty window", 0, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 0, RKey: 1}},
		{"credit before announce", wire.FeatureRing, wire.Message{Op: wire.OpCredit, ConsumedBytes: 1}},
		{"credit in Valkey's protocol", 0, wire.Message{Op: wire.OpCredit}},
		{"shutdown without half-close", wire.FeatureRing, wire.Message{Op: wire.OpShutdown}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, r, _ := newTestEngine(t, c.features, rdmanetHello, 0)
			if c.features == 0 {
				e, r, _ = newTestEngine(t, 0, wire.Hello{}, 0)
			}
			_ = r
			if c.m.Op == wire.OpCredit && c.features == 0 {
				// Valkey's protocol does not know the opcode at all.
				var b [wire.MessageSize]byte
				c.m.Encode(&b)
				e.Handle(&link.Completion{Kind: link.ControlArrived, Msg: b})
			} else {
				control(e, c.m)
			}
			if !errors.Is(e.Err(), wire.ErrProtocol) {
				t.Fatalf("err = %v, want a protocol error", e.Err())
			}
			if _, err := e.Read(make([]byte, 1)); !errors.Is(err, wire.ErrProtocol) {
				t.Fatalf("Read after the error = %v", err)
			}
			if _, err := e.Write([]byte("x")); !errors.Is(err, wire.ErrProtocol) {
				t.Fatalf("Write after the error = %v", err)
			}
		})
	}
}

// TestEngineOverrun: data beyond the credit the peer was given ends the
// stream with a protocol error; what arrived before stays readable.
func TestEngineOverrun(t *testing.T) {
	e, _, _ := newTestEngine(t, wire.FeatureRing, rdmanetHello, 0)
	e.Handle(&link.Completion{Kind: link.DataArrived, N: 100})
	e.Handle(&link.Completion{Kind: link.DataArrived, N: 4096})
	if !errors.Is(e.Err(), wire.ErrProtocol) {
		t.Fatalf("err = %v", e.Err())
	}
	if n, err := e.Read(make([]byte, 1000)); n != 100 || err != nil {
		t.Fatalf("Read = %d, %v; want the 100 bytes that arrived first", n, err)
	}
}

// TestEngineDeadPath: requests outstanding for 2 x KeepAlive with no
// completion fail the stream with a timeout that names a path failure, whatever the
// link does; an idle connection sends Keepalive, and a keepalive that never
// completes is a dead path too.
func TestEngineDeadPath(t *testing.T) {
	const ka = 3 * time.Second
	e, r, clk := newTestEngine(t, wire.FeatureRing, rdmanetHello, ka)
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	if got := e.NextTick().Sub(clk.now); got != ka {
		t.Fatalf("next tick in %v, want %v", got, ka)
	}
	clk.advance(ka)
	e.Tick()
	e.Flush(r)
	if len(r.sent) != 1 || r.sent[0].Kind != link.SendControl {
		t.Fatalf("idle for KeepAlive: posted %+v, want a keepalive", r.sent)
	}
	if m, _ := wire.Decode(r.sent[0].Msg[:], true); m.Op != wire.OpKeepalive {
		t.Fatalf("posted %v, want Keepalive", m.Op)
	}
	clk.advance(deadFactor*ka - time.Millisecond)
	e.Tick()
	if e.Err() != nil {
		t.Fatalf("failed before the bound: %v", e.Err())
	}
	clk.advance(time.Millisecond)
	if !e.NextTick().Equal(clk.now) {
		t.Fatalf("next tick %v, want now (%v)", e.NextTick(), clk.now)
	}
	e.Tick()
	var pd *PathDeadError
	if !errors.As(e.Err(), &pd) || !errors.Is(e.Err(), link.ErrDown) {
		t.Fatalf("err = %v, want a *PathDeadError matching link.ErrDown", e.Err())
	}
	if ne, ok := e.Err().(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("a dead path is not a timeout: %v", e.Err())
	}
}

// idleEngine is an engine with the peer's ring announced, idle, nothing
// outstanding; with receive credit, an iWARP engine.
func idleEngine(t *testing.T, credit bool, ka time.Duration) (*Engine, *recorder, *clock) {
	t.Helper()
	e, r, clk := newTestEngine(t, wire.FeatureRing, rdmanetHello, ka)
	ring := uint32(4096)
	if credit {
		e, r, clk = newIWARPEngine(t, 16, false, ka)
		ring = 64 << 10
	}
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: ring, RKey: 9})
	e.Flush(r)
	completeAll(e, r)
	return e, r, clk
}

// TestEngineLateIsNotDead: a connection whose keepalive waits while other
// links on its path progress (PathProgress) is late, not dead, until
// lateFactor x KeepAlive; once the path goes silent too, deadFactor x
// KeepAlive after its last progress ends it. With receive credit, where
// only the peer's messages count, the same holds for what is heard.
func TestEngineLateIsNotDead(t *testing.T) {
	const ka = time.Second
	for _, credit := range []bool{false, true} {
		idle := func() (*Engine, *recorder, *clock) { return idleEngine(t, credit, ka) }
		e, r, clk := idle()
		start := clk.now
		// Idle for KeepAlive on a quiet path: a keepalive goes and never
		// completes (and with credit, the peer says nothing); from then on
		// the path progresses every half second.
		for clk.now.Sub(start) < (lateFactor-1)*ka {
			clk.advance(ka / 2)
			if clk.now.Sub(start) > ka {
				e.PathProgress(clk.now, clk.now)
			}
			e.Tick()
			e.Flush(r)
			if e.Err() != nil {
				t.Fatalf("credit %v: failed %v in, while the path progressed: %v", credit, clk.now.Sub(start), e.Err())
			}
		}
		// Still progressing, past lateFactor x KeepAlive: dead.
		clk.advance(2 * ka)
		e.PathProgress(clk.now, clk.now)
		if next := e.NextTick(); next.After(clk.now) {
			t.Fatalf("credit %v: %v in, the next check is %v later, want now", credit, clk.now.Sub(start), next.Sub(clk.now))
		}
		e.Tick()
		var pd *PathDeadError
		if !errors.As(e.Err(), &pd) || pd.Outstanding < (lateFactor-deadFactor)*ka {
			t.Fatalf("credit %v: %v in: %v, want a dead path", credit, clk.now.Sub(start), e.Err())
		}
		t.Logf("credit %v: %v", credit, e.Err())

		// The path goes silent: deadFactor x KeepAlive after its last
		// progress.
		e, r, clk = idle()
		clk.advance(ka)
		e.Tick()
		e.Flush(r)
		e.PathProgress(clk.now, clk.now)
		last := clk.now.Add(ka)
		clk.advance(ka)
		e.PathProgress(last, last)
		for e.Err() == nil && clk.now.Sub(last) < 10*ka {
			clk.advance(100 * time.Millisecond)
			e.Tick()
		}
		if got := clk.now.Sub(last); !errors.As(e.Err(), &pd) || got < deadFactor*ka || got > deadFactor*ka+100*time.Millisecond {
			t.Fatalf("credit %v: the path silent for %v: %v; want a dead path after %v", credit, got, e.Err(), deadFactor*ka)
		}
	}
}

// TestEngineKeepaliveFollowsPath: an idle connection on a busy path (sends
// complete and messages arrive on other connections to the peer) sends a
// keepalive every idleFactor x KeepAlive, not every KeepAlive; once the
// path goes quiet it sends one within KeepAlive, and a path that stays
// silent is dead within 3 x KeepAlive of its last progress, as on a
// connection alone. With receive credit (iWARP), where only the peer's
// messages count, the same holds for asking the peer for one.
func TestEngineKeepaliveFollowsPath(t *testing.T) {
	const ka = time.Second
	const step = ka / 10
	for _, credit := range []bool{false, true} {
		e, r, clk := idleEngine(t, credit, ka)
		// keepalives takes what was posted and counts the keepalives;
		// answer: they complete, and with credit the peer answers with a
		// Credit that gives back the receives they took.
		var sentAt []time.Time
		keepalives := func(answer bool) {
			for _, wr := range r.sent {
				if m, _ := wire.Decode(wr.Msg[:], true); wr.Kind == link.SendControl && m.Op == wire.OpKeepalive {
					sentAt = append(sentAt, clk.now)
				}
			}
			if answer {
				completeAll(e, r)
				if credit && len(sentAt) > 0 && sentAt[len(sentAt)-1].Equal(clk.now) {
					control(e, wire.Message{Op: wire.OpCredit, Receives: uint32(e.rc.sent)})
					e.Flush(r)
					completeAll(e, r)
				}
			}
		}
		start := clk.now
		for clk.now.Sub(start) < 40*ka {
			clk.advance(step)
			e.PathProgress(clk.now, clk.now)
			e.Tick()
			e.Flush(r)
			keepalives(true)
			if e.Err() != nil {
				t.Fatalf("credit %v: %v in on a busy path: %v (keepalives at %v)", credit, clk.now.Sub(start), e.Err(), sentAt)
			}
		}
		if n := len(sentAt); n < 40/idleFactor-1 || n > 40/idleFactor+1 {
			t.Fatalf("credit %v: %d keepalives in 40 x KeepAlive on a busy path, want about %d", credit, n, 40/idleFactor)
		}
		for i := 1; i < len(sentAt); i++ {
			if gap := sentAt[i].Sub(sentAt[i-1]); gap > idleFactor*ka+step {
				t.Fatalf("credit %v: keepalives %v apart on a busy path, bound %v", credit, gap, idleFactor*ka)
			}
		}
		// The path goes quiet, and nothing this connection sends from
		// now on completes or is answered.
		quiet, before := clk.now, len(sentAt)
		for e.Err() == nil && clk.now.Sub(quiet) < 10*ka {
			clk.advance(step)
			e.Tick()
			e.Flush(r)
			keepalives(false)
		}
		if len(sentAt) == before || sentAt[before].Sub(quiet) > ka {
			t.Fatalf("credit %v: no keepalive within KeepAlive of the path going quiet: %v", credit, sentAt[before:])
		}
		var pd *PathDeadError
		if got := clk.now.Sub(quiet); !errors.As(e.Err(), &pd) || got > 3*ka {
			t.Fatalf("credit %v: the path silent for %v: %v; want a dead path within %v", credit, got, e.Err(), 3*ka)
		}
	}
}

// TestEngineStallIsNotDead: a Tick that runs long after NextTick said (the
// machine stalled: nothing ran, not the peer's keepalive either) does not
// count the stall as waiting; a wait that goes on once it runs again is a
// dead path deadFactor x KeepAlive later, as ever.
func TestEngineStallIsNotDead(t *testing.T) {
	const ka = time.Second
	e, r, clk := newTestEngine(t, wire.FeatureRing, rdmanetHello, ka)
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	e.Flush(r)
	completeAll(e, r)
	// The keepalive goes at KeepAlive, and never completes.
	clk.advance(e.NextTick().Sub(clk.now))
	e.Tick()
	e.Flush(r)
	if len(r.sent) != 1 {
		t.Fatalf("idle for KeepAlive: posted %d requests, want a keepalive", len(r.sent))
	}
	// The next check is due at deadFactor x KeepAlive; it runs 5 s late.
	due := e.NextTick()
	clk.advance(due.Sub(clk.now) + 5*time.Second)
	e.Tick()
	if e.Err() != nil {
		t.Fatalf("a Tick 5 s late failed the connection: %v", e.Err())
	}
	// Running again, with no completion: dead deadFactor x KeepAlive after
	// the keepalive, the stall not counted.
	resumed := clk.now
	for e.Err() == nil && clk.now.Sub(resumed) < 10*ka {
		clk.advance(min(e.NextTick().Sub(clk.now), 100*time.Millisecond))
		e.Tick()
	}
	var pd *PathDeadError
	if got := clk.now.Sub(resumed); !errors.As(e.Err(), &pd) || got < ka/2 || got > deadFactor*ka {
		t.Fatalf("%v after the stall: %v; want a dead path after %v (time to take what came meanwhile) and within %v", got, e.Err(), ka/2, deadFactor*ka)
	}
}

// TestEngineBusyIsNotDead: a connection whose requests keep completing is
// never declared dead, however long it is busy.
func TestEngineBusyIsNotDead(t *testing.T) {
	const ka = time.Second
	e, r, clk := newTestEngine(t, wire.FeatureRing|wire.FeatureShutdown, rdmanetHello, ka)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	for i := 0; i < 100; i++ {
		e.Write(make([]byte, 1000))
		e.Flush(r)
		clk.advance(ka / 2)
		completeAll(e, r)
		control(e, wire.Message{Op: wire.OpCredit, ConsumedBytes: e.send.(*SendRing).sent})
		e.Tick()
		e.Flush(r)
		if e.Err() != nil {
			t.Fatalf("step %d: %v", i, e.Err())
		}
	}
}

func TestEngineEndOfStream(t *testing.T) {
	e, _, _ := newTestEngine(t, wire.FeatureRing|wire.FeatureShutdown, rdmanetHello, 0)
	e.Handle(&link.Completion{Kind: link.DataArrived, N: 5})
	control(e, wire.Message{Op: wire.OpShutdown})
	b := make([]byte, 10)
	if n, err := e.Read(b); n != 5 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if _, err := e.Read(b); err != io.EOF {
		t.Fatalf("Read after Shutdown = %v, want EOF", err)
	}
	// The peer shut down its side only: this side may still write.
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	if n, err := e.Write([]byte("reply")); n != 5 || err != nil {
		t.Fatalf("Write after the peer's Shutdown = %d, %v", n, err)
	}
	e.Handle(&link.Completion{Kind: link.Disconnected})
	if _, err := e.Write([]byte("x")); err != ErrPeerClosed {
		t.Fatalf("Write after disconnect = %v", err)
	}
}

// TestEngineEndAt: with end positions (wire.FeatureEndAt) a Shutdown says
// where the peer's bytes end, and one that says more than arrived ends the
// stream with a protocol error, not an EOF short of what was sent (a data
// arrival the link lost); this side's Shutdown says how much it posted.
func TestEngineEndAt(t *testing.T) {
	const features = wire.FeatureRing | wire.FeatureShutdown | wire.FeatureEndAt
	hello := rdmanetHello
	hello.Features = features
	e, r, _ := newTestEngine(t, features, hello, 0)
	e.Handle(&link.Completion{Kind: link.DataArrived, N: 5})
	control(e, wire.Message{Op: wire.OpShutdown, At: 5})
	b := make([]byte, 10)
	if n, err := e.Read(b); n != 5 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if _, err := e.Read(b); err != io.EOF {
		t.Fatalf("Read after a Shutdown at the end of what arrived = %v, want EOF", err)
	}
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	e.Write([]byte("first"))
	e.Write([]byte("second"))
	if err := e.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	e.Flush(r)
	last := r.sent[len(r.sent)-1]
	if m, _ := wire.Decode(last.Msg[:], true); m.Op != wire.OpShutdown || m.At != uint64(len("firstsecond")) {
		t.Fatalf("this side's last message %+v; want Shutdown at %d", m, len("firstsecond"))
	}

	// A Shutdown, and a session's Close, beyond what arrived.
	sessionEndAt := closeFeatures | wire.FeatureEndAt
	for _, c := range []struct {
		op       wire.Opcode
		features wire.Features
		hello    wire.Hello
	}{{wire.OpShutdown, features, hello}, {wire.OpClose, sessionEndAt, sessionHelloFor(sessionEndAt)}} {
		e, _, _ = newTestEngine(t, c.features, c.hello, 0)
		e.Handle(&link.Completion{Kind: link.DataArrived, N: 5})
		control(e, wire.Message{Op: c.op, At: 9})
		if !errors.Is(e.Err(), wire.ErrProtocol) {
			t.Fatalf("%v at 9 bytes after 5 arrived: err = %v, want a protocol error", c.op, e.Err())
		}
		// What arrived stays readable; then the error, not EOF.
		var err error
		for range 3 {
			if _, err = e.Read(b); err != nil {
				break
			}
		}
		if !errors.Is(err, wire.ErrProtocol) {
			t.Fatalf("Read after a short stream: %v, want the protocol error", err)
		}
	}

	// Without the extension the position is not looked at (a peer that
	// has none sends zeros there).
	e, _, _ = newTestEngine(t, wire.FeatureRing|wire.FeatureShutdown, rdmanetHello, 0)
	e.Handle(&link.Completion{Kind: link.DataArrived, N: 5})
	control(e, wire.Message{Op: wire.OpShutdown, At: 9})
	if e.Err() != nil {
		t.Fatalf("a position without the extension: %v", e.Err())
	}
}

// TestEngineCloseWriteAfterData: Shutdown goes out after every data request
// written before it, and Writes after it fail.
func TestEngineCloseWriteAfterData(t *testing.T) {
	e, r, _ := newTestEngine(t, wire.FeatureRing|wire.FeatureShutdown, rdmanetHello, 0)
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpRegisterXferMemory, Addr: 1 << 20, Length: 4096, RKey: 9})
	e.Write([]byte("first"))
	e.Write([]byte("second")) // held: the first is in flight
	if err := e.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	e.Flush(r)
	var kinds []link.SendKind
	for _, wr := range r.sent {
		kinds = append(kinds, wr.Kind)
	}
	last := r.sent[len(r.sent)-1]
	if m, _ := wire.Decode(last.Msg[:], true); last.Kind != link.SendControl || m.Op != wire.OpShutdown {
		t.Fatalf("posted %v; want the data, then Shutdown", kinds)
	}
	data := 0
	for _, wr := range r.sent {
		if wr.Kind == link.SendData {
			data += int(wr.N)
		}
	}
	if data != len("firstsecond") {
		t.Fatalf("%d data bytes posted before Shutdown, want %d", data, len("firstsecond"))
	}
	if _, err := e.Write([]byte("x")); err != ErrWriteShutdown {
		t.Fatalf("Write after CloseWrite = %v", err)
	}
}

func TestEngineNewRejectsBadPeer(t *testing.T) {
	_, err := New(Config{
		Features: wire.FeatureRing, Peer: wire.Hello{Version: 1, RecvDepth: 8}, PeerHello: true,
		Caps: link.Caps{SendDepth: 8, RecvDepth: 8, ControlDepth: 2}, SendRing: make([]byte, 64), RecvRing: make([]byte, 64),
	})
	if !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("a ring of 0 bytes: %v", err)
	}
}

// TestEnginePeerRingKnown: with the peer's ring named before the stream
// began (Config.PeerRing, as a link group's open carries it), data goes
// at once, without waiting for the peer's RegisterXferMemory; the peer's
// own announcement of the same ring changes nothing, and one that names
// another ring is a protocol error.
func TestEnginePeerRingKnown(t *testing.T) {
	peerRing := wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x9000, Length: 4096, RKey: 3}
	start := func(t *testing.T) (*Engine, *recorder) {
		e, err := New(Config{
			Features: wire.FeatureRing, Peer: rdmanetHello, PeerHello: true,
			Caps:     link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4},
			SendRing: make([]byte, 4096), RecvRing: make([]byte, 4096), RecvAddr: 0x1000, RecvKey: 7,
			PeerRing: &peerRing,
		})
		if err != nil {
			t.Fatal(err)
		}
		r := &recorder{}
		e.Start()
		e.Flush(r)
		completeAll(e, r) // this side's own announcement, sent and done
		if _, err := e.Write([]byte("early")); err != nil {
			t.Fatal(err)
		}
		e.Flush(r)
		return e, r
	}
	t.Run("data before the peer's announcement", func(t *testing.T) {
		_, r := start(t)
		var data []link.SendWR
		for _, wr := range r.sent {
			if wr.Kind == link.SendData {
				data = append(data, wr)
			}
		}
		if len(data) != 1 || data[0].N != 5 || data[0].Remote != 0x9000 || data[0].RKey != 3 {
			t.Fatalf("posted %+v, want the 5 bytes written into the named ring at once", r.sent)
		}
	})
	t.Run("the same ring announced", func(t *testing.T) {
		e, _ := start(t)
		control(e, peerRing)
		if err := e.Err(); err != nil {
			t.Fatalf("the peer's announcement of the named ring: %v", err)
		}
		control(e, peerRing) // a second announcement, as without PeerRing
		if err := e.Err(); !errors.Is(err, wire.ErrProtocol) {
			t.Fatalf("a ring announced twice: %v, want a protocol error", err)
		}
	})
	t.Run("another ring announced", func(t *testing.T) {
		e, _ := start(t)
		other := peerRing
		other.Addr += 4096
		control(e, other)
		if err := e.Err(); !errors.Is(err, wire.ErrProtocol) {
			t.Fatalf("another ring than the one named: %v, want a protocol error", err)
		}
	})
}

// TestEngineOpenRing: with wire.FeatureOpenRing the open and its answer
// announced both rings: the engine sends no RegisterXferMemory as it
// starts, writes into the named ring at once, and takes a
// RegisterXferMemory the peer should not have sent as a ring announced
// twice. It needs the named ring.
func TestEngineOpenRing(t *testing.T) {
	peerRing := wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x9000, Length: 4096, RKey: 3}
	cfg := Config{
		Features: wire.FeatureRing | wire.FeatureOpenRing, Peer: rdmanetHello, PeerHello: true,
		Caps:     link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4},
		SendRing: make([]byte, 4096), RecvRing: make([]byte, 4096), RecvAddr: 0x1000, RecvKey: 7,
	}
	if _, err := New(cfg); err == nil {
		t.Fatal("FeatureOpenRing without the peer's named ring: no error")
	}
	cfg.PeerRing = &peerRing
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	e.Start()
	e.Flush(r)
	if len(r.sent) != 0 {
		t.Fatalf("posted %+v at Start, want nothing: the open announced the ring", r.sent)
	}
	if _, err := e.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	e.Flush(r)
	if len(r.sent) != 1 || r.sent[0].Kind != link.SendData || r.sent[0].Remote != 0x9000 || r.sent[0].RKey != 3 {
		t.Fatalf("posted %+v, want the 5 bytes written into the named ring", r.sent)
	}
	control(e, peerRing)
	if err := e.Err(); !errors.Is(err, wire.ErrProtocol) {
		t.Fatalf("a RegisterXferMemory after rings named by the open: %v, want a protocol error", err)
	}
}

// TestEnginePeerRingMovedFirst: a link group's stream may move to another
// link before the peer's announcement of the ring its open named comes
// (rebalanced at once, in the lab). On the new link the peer announces
// that ring with the new link's key: the engine takes it as the ring's
// name now, and writes with it.
func TestEnginePeerRingMovedFirst(t *testing.T) {
	peerRing := wire.Message{Op: wire.OpRegisterXferMemory, Addr: 0x9000, Length: 4096, RKey: 3}
	peer := rdmanetHello
	peer.Features |= wire.FeatureResume
	e, err := New(Config{
		Features: wire.FeatureRing | wire.FeatureResume, Peer: peer, PeerHello: true,
		Caps:     link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4},
		SendRing: make([]byte, 4096), RecvRing: make([]byte, 4096), RecvAddr: 0x1000, RecvKey: 7,
		PeerRing: &peerRing,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	e.Start()
	e.Flush(r)
	completeAll(e, r)
	e.Handle(&link.Completion{Kind: link.Failed, Err: link.ErrDown})
	e.AfterCompletions()
	if e.Lost() == nil {
		t.Fatalf("a failed link did not suspend the resumable engine: %v", e.Err())
	}
	if err := e.Relink(link.Caps{SendDepth: 64, RecvDepth: 64, ControlDepth: 4}, 0x2000, 8); err != nil {
		t.Fatal(err)
	}
	e.Flush(r)
	completeAll(e, r)
	control(e, wire.Message{Op: wire.OpResume})
	moved := peerRing
	moved.RKey = 4 // the same memory, named on the new link
	control(e, moved)
	if err := e.Err(); err != nil {
		t.Fatalf("the named ring announced with the new link's key: %v", err)
	}
	if _, err := e.Write([]byte("after the move")); err != nil {
		t.Fatal(err)
	}
	e.Flush(r)
	var data []link.SendWR
	for _, wr := range r.sent {
		if wr.Kind == link.SendData {
			data = append(data, wr)
		}
	}
	if len(data) != 1 || data[0].RKey != 4 || data[0].Remote != 0x9000 {
		t.Fatalf("posted %+v, want the bytes written with the new key", r.sent)
	}
}
