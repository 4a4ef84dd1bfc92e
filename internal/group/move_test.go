package group_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/stream"
	"github.com/rdmanet/sdk/internal/wire"
)

// moveConfig is a group that moves its streams, a the dialer (Mover).
func moveConfig(mover bool) group.Config {
	c := group.DefaultConfig()
	c.MoveTimeout, c.Mover = 2*time.Second, mover
	return c
}

// twoLinkPair makes two groups over two pipes each, as a dialer with two
// paths makes them.
func twoLinkPair(t testing.TB, ca, cb group.Config) (a, b *group.Mux, path1, path2 [2]*link.Pipe) {
	t.Helper()
	a, b, pa, pb := muxPair(t, ca, cb, baseConfig())
	qa, qb := linktest.NewPipes(t, baseConfig(), baseConfig())
	if err := b.AddLink(qb); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(qa); err != nil {
		t.Fatal(err)
	}
	return a, b, [2]*link.Pipe{pa, pb}, [2]*link.Pipe{qa, qb}
}

// takeUntil polls s until a completion of kind comes, and returns those
// before it and it.
func takeUntil(t testing.TB, s link.Link, kind link.CompletionKind) []link.Completion {
	t.Helper()
	var got []link.Completion
	deadline := time.Now().Add(linktest.HangGuard)
	for time.Now().Before(deadline) {
		for _, c := range linktest.PollAll(t, s) {
			got = append(got, c)
			if c.Kind == kind {
				return got
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no %v in %v", kind, linktest.Kinds(got))
	return nil
}

// announce names to's ring to from's side, as its engine does on a new
// link (RegisterXferMemory): the group checks writes against it.
func announce(t testing.TB, to, from *group.Stream) {
	t.Helper()
	addr, key := to.RecvRingKey()
	m := wire.Message{Op: wire.OpRegisterXferMemory, Addr: addr, Length: uint32(len(to.RecvRing())), RKey: key}
	wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: 100}
	m.Encode(&wr.Msg)
	linktest.Post(t, to, wr)
	linktest.WantKinds(t, "announced to", linktest.WaitFor(t, from, 1), "control-arrived")
	linktest.WaitFor(t, to, 1) // its SendDone
	if err := from.PostRecv(1); err != nil {
		t.Fatal(err)
	}
}

// ping writes b's bytes into the peer's ring and sends a control message
// after them, and checks both arrive, in order.
func ping(t testing.TB, from, to *group.Stream, b []byte, id uint64) {
	t.Helper()
	copy(from.SendRing(), b)
	addr, key := to.RecvRingKey()
	linktest.Post(t, from,
		link.SendWR{Kind: link.SendData, ID: id, N: uint32(len(b)), Remote: addr, RKey: key},
		linktest.Control(id+1, b[0]))
	cs := linktest.WaitFor(t, to, 2)
	linktest.WantKinds(t, "receiver", cs, fmt.Sprintf("data-arrived %d", len(b)), "control-arrived")
	if got := to.RecvRing()[:len(b)]; !bytes.Equal(got, b) {
		t.Errorf("ring holds %q, want %q", got, b)
	}
	if err := to.PostRecv(2); err != nil {
		t.Fatal(err)
	}
	linktest.WaitFor(t, from, 1) // the control message's SendDone
}

// TestSpread: new streams open on the link with the fewest, or all on
// the first with SpreadFirstLink.
func TestSpread(t *testing.T) {
	for _, tc := range []struct {
		spread group.Spread
		want   []int
	}{
		{group.SpreadLeastStreams, []int{3, 3}},
		{group.SpreadFirstLink, []int{6, 0}},
	} {
		t.Run(tc.spread.String(), func(t *testing.T) {
			ca := moveConfig(true)
			ca.Spread = tc.spread
			a, b, _, _ := twoLinkPair(t, ca, moveConfig(false))
			for range 6 {
				x, y := openPair(t, a, b)
				t.Cleanup(func() { x.Close(); y.Close() })
			}
			ls := a.Links()
			if len(ls) != 2 || ls[0].Streams != tc.want[0] || ls[1].Streams != tc.want[1] {
				t.Errorf("links %+v, want streams %v", ls, tc.want)
			}
		})
	}
}

// TestMoveOnCut: when a link of the group fails, its streams report a
// Failed that matches link.ErrDown, then link.Resumed, at both ends, and
// work on the other link with their rings named anew; the streams on the
// other link see nothing.
func TestMoveOnCut(t *testing.T) {
	linktest.CheckGoroutines(t)
	a, b, path1, _ := twoLinkPair(t, moveConfig(true), moveConfig(false))
	var xs, ys []*group.Stream
	for range 4 {
		x, y := openPair(t, a, b)
		xs, ys = append(xs, x), append(ys, y)
		defer x.Close()
		defer y.Close()
	}
	// Spread: streams 0 and 2 on the first link, 1 and 3 on the second.
	oldKey := make([]uint32, 4)
	for i, y := range ys {
		_, oldKey[i] = y.RecvRingKey()
		ping(t, xs[i], y, []byte("before"), 1)
	}
	armAll(t, xs, ys) // the moves count them off one link and onto the other
	path1[0].Cut(errors.New("test: port down"))
	for _, i := range []int{0, 2} {
		for who, s := range map[string]*group.Stream{"dialer": xs[i], "listener": ys[i]} {
			cs := takeUntil(t, s, link.Resumed)
			linktest.WantKinds(t, who, cs, "failed", "resumed")
			if !errors.Is(cs[0].Err, link.ErrDown) {
				t.Errorf("%s stream %d failed with %v, want link.ErrDown", who, i, cs[0].Err)
			}
		}
		if _, key := ys[i].RecvRingKey(); key == oldKey[i] {
			t.Errorf("stream %d: its ring has the same key on the new link", i)
		}
		announce(t, ys[i], xs[i])
	}
	for i := range 4 {
		ping(t, xs[i], ys[i], []byte("after the move"), 10)
	}
	for _, s := range []*group.Stream{xs[1], ys[1], xs[3], ys[3]} {
		if cs := linktest.PollAll(t, s); len(cs) != 0 {
			t.Errorf("a stream on the link that works got %v", linktest.Kinds(cs))
		}
	}
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		st := m.Stats()
		if st.Links != 1 || st.LinksDown != 1 || st.Moved != 2 || st.Streams != 4 || st.Suspended != 0 {
			t.Errorf("%s: %+v, want 1 link, 1 down, 2 moved, 4 streams", who, st)
		}
		if ls := m.Links(); len(ls) != 1 || ls[0].Streams != 4 {
			t.Errorf("%s: links %+v", who, ls)
		}
		if err := m.ArmedStreamsError(); err != nil {
			t.Errorf("%s: %v", who, err)
		}
	}
}

// armAll arms every stream, as an idle connection's FD does.
func armAll(t *testing.T, streams ...[]*group.Stream) {
	t.Helper()
	for _, ss := range streams {
		for _, s := range ss {
			if err := s.Arm(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestMoveToLinkAdded: a group whose only link failed waits for a new one:
// the dialer moves its streams onto the link it adds.
func TestMoveToLinkAdded(t *testing.T) {
	a, b, pa, _ := muxPair(t, moveConfig(true), moveConfig(false), baseConfig())
	x, y := openPair(t, a, b)
	defer x.Close()
	defer y.Close()
	pa.Cut(nil)
	linktest.WantKinds(t, "dialer", linktest.WaitFor(t, x, 1), "failed")
	linktest.WantKinds(t, "listener", linktest.WaitFor(t, y, 1), "failed")
	if _, err := a.Open(context.Background(), 7); !errors.Is(err, group.ErrDown) {
		t.Errorf("Open with no link: %v, want group.ErrDown", err)
	}
	qa, qb := linktest.NewPipes(t, baseConfig(), baseConfig())
	if err := b.AddLink(qb); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(qa); err != nil {
		t.Fatal(err)
	}
	linktest.WantKinds(t, "dialer", linktest.WaitFor(t, x, 1), "resumed")
	linktest.WantKinds(t, "listener", linktest.WaitFor(t, y, 1), "resumed")
	announce(t, y, x)
	announce(t, x, y)
	ping(t, x, y, []byte("on the new link"), 1)
	ping(t, y, x, []byte("and back"), 3)
}

// TestLinkDownOnlyWhileGoingOn: a group whose peer closes it ends with its
// last link, and its OnLinkDown is not called: there is no path to make a
// link on again, and no connection to move (the owner logged a failed link
// for every group that ended).
func TestLinkDownOnlyWhileGoingOn(t *testing.T) {
	ca := moveConfig(true)
	var downs atomic.Int32
	ca.OnLinkDown = func(link.Carrier, error) { downs.Add(1) }
	a, b, _, _ := muxPair(t, ca, moveConfig(false), baseConfig())
	x, y := openPair(t, a, b)
	x.Close()
	y.Close()
	b.Close()
	if err := waitErr(t, a); err == nil {
		t.Fatal("the dialer's group goes on")
	}
	time.Sleep(50 * time.Millisecond) // OnLinkDown runs on a goroutine of its own
	if n := downs.Load(); n != 0 {
		t.Errorf("OnLinkDown called %d times for a group that ended, want none", n)
	}
}

// TestMoveTimeout: a stream that no link takes within MoveTimeout ends
// with a *MoveError (link.Ended, as a session that could not resume), and
// a group with no link left ends.
func TestMoveTimeout(t *testing.T) {
	ca, cb := moveConfig(true), moveConfig(false)
	ca.MoveTimeout, cb.MoveTimeout = 100*time.Millisecond, 100*time.Millisecond
	var downs atomic.Int32
	ca.OnLinkDown = func(link.Carrier, error) { downs.Add(1) }
	a, b, pa, _ := muxPair(t, ca, cb, baseConfig())
	x, y := openPair(t, a, b)
	defer x.Close()
	defer y.Close()
	start := time.Now()
	pa.Cut(nil)
	for who, s := range map[string]*group.Stream{"dialer": x, "listener": y} {
		cs := takeUntil(t, s, link.Ended)
		linktest.WantKinds(t, who, cs, "failed", "ended")
		var me *group.MoveError
		if !errors.As(cs[1].Err, &me) || !errors.Is(cs[1].Err, link.ErrDown) {
			t.Errorf("%s: ended with %v, want a *MoveError of a link that failed", who, cs[1].Err)
		}
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("streams ended after %v, before MoveTimeout", waited)
	}
	if n := downs.Load(); n != 1 {
		t.Errorf("OnLinkDown called %d times, want once", n)
	}
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		if err := waitErr(t, m); !errors.Is(err, group.ErrDown) {
			t.Errorf("%s group ended with %v, want ErrDown", who, err)
		}
		if st := m.Stats(); st.MovesFailed != 1 || st.Streams != 1 {
			t.Errorf("%s: %+v, want 1 move failed and the stream held until Close", who, st)
		}
	}
	x.Close()
	y.Close()
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		if st := m.Stats(); st.Streams != 0 {
			t.Errorf("%s: %d streams after Close", who, st.Streams)
		}
	}
}

// TestMoveClosedWhileSuspended: a stream closed while it waits for a move
// still moves, so that its StreamClose reaches the peer, and both sides
// give its slot back.
func TestMoveClosedWhileSuspended(t *testing.T) {
	a, b, path1, _ := twoLinkPair(t, moveConfig(true), moveConfig(false))
	x, y := openPair(t, a, b) // on the first link
	path1[1].Silence()        // so that the move waits for the Cut below
	x.Close()
	path1[0].Cut(nil)
	cs := takeUntil(t, y, link.Disconnected)
	linktest.WantKinds(t, "listener", cs, "failed", "resumed", "disconnected")
	y.Close()
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		deadline := time.Now().Add(linktest.HangGuard)
		for m.Stats().Streams != 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if st := m.Stats(); st.Streams != 0 || st.Moved != 1 {
			t.Errorf("%s: %+v, want the stream moved and gone", who, st)
		}
	}
}

// TestHostileMoves: a StreamMove to the dialer, a StreamMoved that answers
// no move, and a move of another's stream are protocol errors that end
// the group; a move of a stream that ended is answered ReasonGone.
func TestHostileMoves(t *testing.T) {
	move := wire.GroupMessage{Op: wire.OpStreamMove, To: wire.MakeStreamTag(1, 1), From: wire.MakeStreamTag(1, 1), Grant: 8}
	moved := move
	moved.Op = wire.OpStreamMoved
	for _, tc := range []struct {
		name string
		cfg  group.Config
		msg  wire.GroupMessage
	}{
		{"move to the dialer", moveConfig(true), move},
		{"move in a group without moves", group.DefaultConfig(), move},
		{"moved unasked", moveConfig(true), moved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, pb := rawPeer(t, tc.cfg)
			linktest.Post(t, pb, groupMsg(tc.msg))
			if err := waitErr(t, m); !errors.Is(err, wire.ErrProtocol) {
				t.Errorf("group ended with %v, want a protocol error", err)
			}
		})
	}
	t.Run("move of a stream not open", func(t *testing.T) {
		m, pb := rawPeer(t, moveConfig(false))
		linktest.Post(t, pb, groupMsg(wire.GroupMessage{Op: wire.OpStreamMove, To: wire.MakeStreamTag(5, 1), From: wire.MakeStreamTag(1, 1), Grant: 8}))
		var got wire.GroupMessage
		cs := linktest.WaitFor(t, pb, 2)
		for _, c := range cs {
			if c.Kind == link.ControlArrived {
				got, _ = wire.DecodeGroup(&c.Msg)
			}
		}
		if got.Op != wire.OpStreamMoved || got.Reason != wire.ReasonGone || got.To != wire.MakeStreamTag(1, 1) {
			t.Errorf("answer %+v, want StreamMoved with ReasonGone", got)
		}
		if err := m.Err(); err != nil {
			t.Errorf("the group ended: %v", err)
		}
	})
}

// TestRebalanceOnAdd: a link the dialer adds takes its share of the
// streams from the links that work: each stream that moves reports a
// Failed that matches link.ErrDown, then Resumed, at both ends, and works
// on its new link; the others see nothing.
func TestRebalanceOnAdd(t *testing.T) {
	linktest.CheckGoroutines(t)
	a, b, _, _ := muxPair(t, moveConfig(true), moveConfig(false), baseConfig())
	xs, ys, closeAll := openPairs(t, a, b, 6)
	defer closeAll()
	armAll(t, xs, ys)
	qa, qb := linktest.NewPipes(t, baseConfig(), baseConfig())
	if err := b.AddLink(qb); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(qa); err != nil {
		t.Fatal(err)
	}
	moved := 0
	for i := range xs {
		cs := linktest.PollAll(t, xs[i])
		if len(cs) == 0 {
			continue
		}
		moved++
		if cs[len(cs)-1].Kind != link.Resumed {
			cs = append(cs, takeUntil(t, xs[i], link.Resumed)...)
		}
		linktest.WantKinds(t, "dialer", cs, "failed", "resumed")
		linktest.WantKinds(t, "listener", takeUntil(t, ys[i], link.Resumed), "failed", "resumed")
		announce(t, ys[i], xs[i])
		announce(t, xs[i], ys[i])
	}
	for i := range xs {
		ping(t, xs[i], ys[i], []byte("after the rebalance"), 10)
	}
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		ls := m.Links()
		if len(ls) != 2 || ls[0].Streams != 3 || ls[1].Streams != 3 {
			t.Errorf("%s: links %+v, want 3 streams each", who, ls)
		}
		if st := m.Stats(); st.Moved != 3 || st.LinksDown != 0 {
			t.Errorf("%s: %+v, want 3 moved and no link down", who, st)
		}
		if err := m.ArmedStreamsError(); err != nil {
			t.Errorf("%s: %v", who, err)
		}
	}
	if moved != 3 {
		t.Errorf("%d streams moved, want 3", moved)
	}
}

// TestRebalanceAfterLinksAddedAtOnce: streams that wait for a link (the
// only one was cut) move onto the first link added; a second link added
// at once, while their moves are not yet answered, can take none of them
// then (a stream that moves may not leave), and once the moves are
// answered the links even out: 4 and 4, not 8 and 0 (the bench's group,
// its two paths back one after the other, stayed at 64 and 36).
func TestRebalanceAfterLinksAddedAtOnce(t *testing.T) {
	linktest.CheckGoroutines(t)
	a, b, pa, _ := muxPair(t, moveConfig(true), moveConfig(false), baseConfig())
	xs, ys, closeAll := openPairs(t, a, b, 8)
	defer closeAll()
	pa.Cut(nil)
	for i := range xs {
		linktest.WantKinds(t, "dialer", linktest.WaitFor(t, xs[i], 1), "failed")
		linktest.WantKinds(t, "listener", linktest.WaitFor(t, ys[i], 1), "failed")
	}
	q1a, q1b := linktest.NewPipes(t, baseConfig(), baseConfig())
	q2a, q2b := linktest.NewPipes(t, baseConfig(), baseConfig())
	for _, m := range []struct {
		mux  *group.Mux
		q, r *link.Pipe
	}{{b, q1b, q2b}, {a, q1a, q2a}} {
		if err := m.mux.AddLink(m.q); err != nil {
			t.Fatal(err)
		}
		if err := m.mux.AddLink(m.r); err != nil {
			t.Fatal(err)
		}
	}
	// The moves: 8 onto a link, then 4 of them onto the other, at both
	// ends.
	for end := time.Now().Add(linktest.HangGuard); a.Stats().Moved+b.Stats().Moved < 24; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("dialer: links %+v, %+v; listener %+v; want 8 moves and 4 more at each end, 4 streams on each link", a.Links(), a.Stats(), b.Stats())
		}
	}
	if ls := a.Links(); len(ls) != 2 || ls[0].Streams != 4 || ls[1].Streams != 4 {
		t.Fatalf("dialer: links %+v; want 4 streams on each", ls)
	}
	// Every stream resumed (4 of them twice), and works.
	for i := range xs {
		for who, s := range map[string]*group.Stream{"dialer": xs[i], "listener": ys[i]} {
			cs := linktest.PollAll(t, s)
			if len(cs) == 0 || cs[len(cs)-1].Kind != link.Resumed {
				t.Fatalf("%s's stream %d: %v; want it resumed last", who, i, cs)
			}
		}
		announce(t, ys[i], xs[i])
		announce(t, xs[i], ys[i])
	}
	for i := range xs {
		ping(t, xs[i], ys[i], []byte("on the links added"), 2)
	}
	// Everything ends before the pipes' goroutine checks run (each
	// NewPipes checks what began after it).
	closeAll()
	a.Close()
	b.Close()
	for _, p := range []*link.Pipe{q1a, q1b, q2a, q2b} {
		p.Close()
	}
}

// TestPeerLeft: when the dialer's process dies its kernel disconnects its
// links: the other side's streams end as their peer's close
// (stream.ErrPeerLeftLink, which Conn reads as io.EOF) after PeerLeftWait,
// not after the move timeout.
func TestPeerLeft(t *testing.T) {
	cb := moveConfig(false)
	cb.MoveTimeout, cb.PeerLeftWait = time.Minute, 100*time.Millisecond
	a, b, pa, _ := muxPair(t, moveConfig(true), cb, baseConfig())
	x, y := openPair(t, a, b)
	defer x.Close()
	defer y.Close()
	start := time.Now()
	pa.Close() // as the dialer's kernel does for a process that died
	cs := takeUntil(t, y, link.Ended)
	linktest.WantKinds(t, "listener", cs, "failed", "ended")
	if !errors.Is(cs[1].Err, stream.ErrPeerLeftLink) {
		t.Errorf("ended with %v, want stream.ErrPeerLeftLink", cs[1].Err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("ended %v after the peer left, want about PeerLeftWait", took)
	}
	if err := waitErr(t, b); !group.Disconnected(err) {
		t.Errorf("group ended with %v, want the peer's disconnection", err)
	}
}

// TestFirstLinkStandsBy: with SpreadFirstLink, a link added to a group
// that has streams stands by: none moves onto it (the bench found them
// spread 4 and 4 once path 2's link joined).
func TestFirstLinkStandsBy(t *testing.T) {
	ca := moveConfig(true)
	ca.Spread = group.SpreadFirstLink
	a, b, _, _ := muxPair(t, ca, moveConfig(false), baseConfig())
	for range 6 {
		x, y := openPair(t, a, b)
		t.Cleanup(func() { x.Close(); y.Close() })
	}
	qa, qb := linktest.NewPipes(t, baseConfig(), baseConfig())
	if err := b.AddLink(qb); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(qa); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // a move would have begun
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		if ls := m.Links(); len(ls) != 2 || ls[0].Streams != 6 || ls[1].Streams != 0 || m.Stats().Moved != 0 {
			t.Errorf("%s: links %+v, %+v; want the 6 streams left on the first", who, ls, m.Stats())
		}
	}
}

// TestEmptyGroupEnds: a group whose last link fails with no stream on it
// ends at once, not at MoveTimeout: it has nothing to move, and a link
// made again would only sit idle, pinned, and retry a peer that may be
// gone. (A stream closed while it waits for a move keeps the group until
// the move or MoveTimeout: TestMoveClosedWhileSuspended.)
func TestEmptyGroupEnds(t *testing.T) {
	slow := func(mover bool) group.Config {
		c := moveConfig(mover)
		c.MoveTimeout = time.Hour // longer than the hang guard: only the rule ends it
		return c
	}
	a, b, pa, _ := muxPair(t, slow(true), slow(false), baseConfig())
	x, y := openPair(t, a, b)
	x.Close()
	y.Close()
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		for deadline := time.Now().Add(linktest.HangGuard); m.Stats().Streams != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the closed stream was never freed: %+v", who, m.Stats())
			}
		}
	}
	pa.Cut(nil)
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		if err := waitErr(t, m); !errors.Is(err, group.ErrDown) {
			t.Errorf("%s group ended with %v, want ErrDown", who, err)
		}
	}
}

// TestOpenLostWithItsLink: the link a stream opens on fails after its
// StreamOpen arrived and before the answer did. Open fails with
// ErrOpenLost, not as a group that is down: the group lives on with its
// other link and the stream there. The stream the peer accepted for the
// lost open, which nobody opened, ends within MoveTimeout.
func TestOpenLostWithItsLink(t *testing.T) {
	ca, cb := moveConfig(true), moveConfig(false)
	ca.MoveTimeout, cb.MoveTimeout = 200*time.Millisecond, 200*time.Millisecond
	a, b, _, path2 := twoLinkPair(t, ca, cb)
	x, y := openPair(t, a, b) // on the first link: the next open goes to the second
	defer x.Close()
	defer y.Close()
	path2[1].SetDelay(time.Hour) // the peer's answers on path 2 never land
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	opened := make(chan error, 1)
	go func() {
		s, err := a.Open(ctx, 7)
		if s != nil {
			s.Close()
		}
		opened <- err
	}()
	orphan, err := b.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer orphan.Close()
	path2[0].Cut(errors.New("test: port down"))
	cut := time.Now()
	if err := <-opened; !errors.Is(err, group.ErrOpenLost) {
		t.Errorf("Open whose link failed: %v, want group.ErrOpenLost", err)
	}
	ping(t, x, y, []byte("the other link works on"), 1)
	x2, y2 := openPair(t, a, b)
	defer x2.Close()
	defer y2.Close()
	ping(t, x2, y2, []byte("and takes new streams"), 1)
	cs := takeUntil(t, orphan, link.Ended)
	var me *group.MoveError
	if !errors.As(cs[len(cs)-1].Err, &me) {
		t.Errorf("the stream of the lost open ended with %v, want a *MoveError", cs[len(cs)-1].Err)
	}
	t.Logf("the stream of the lost open ended %v after the cut", time.Since(cut).Round(time.Millisecond))
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		if st := m.Stats(); st.Links != 1 || st.LinksDown != 1 {
			t.Errorf("%s: %+v, want 1 link left, 1 down", who, st)
		}
	}
	if err := a.Err(); err != nil {
		t.Errorf("the dialer's group ended: %v", err)
	}
}
