package group_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/wire"
)

// rawPeer is a group whose peer is the test, speaking on the bare base
// link: what a broken or hostile peer may send.
func rawPeer(t testing.TB, cfg group.Config) (*group.Mux, *link.Pipe) {
	t.Helper()
	pa, pb := linktest.NewPipes(t, baseConfig(), baseConfig())
	m, err := group.New(pa, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, pb
}

func groupMsg(g wire.GroupMessage) link.SendWR {
	wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: 1}
	g.Encode(&wr.Msg)
	return wr
}

// waitErr waits for the group to end and returns why.
func waitErr(t testing.TB, m *group.Mux) error {
	t.Helper()
	deadline := time.Now().Add(linktest.HangGuard)
	for time.Now().Before(deadline) {
		if err := m.Err(); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the group did not end")
	return nil
}

// receiveOpen takes the StreamOpen a group sent the raw peer.
func receiveOpen(t testing.TB, pb *link.Pipe) wire.GroupMessage {
	t.Helper()
	for {
		for _, c := range linktest.WaitFor(t, pb, 1) {
			if c.Kind != link.ControlArrived {
				continue
			}
			g, err := wire.DecodeGroup(&c.Msg)
			if err != nil {
				t.Fatal(err)
			}
			pb.PostRecv(1)
			return g
		}
	}
}

// TestHostileGroupMessages: a group message the protocol does not allow
// ends the group with a protocol error, and its streams with it; nothing
// panics or hangs.
func TestHostileGroupMessages(t *testing.T) {
	ring := func(op wire.Opcode) wire.GroupMessage {
		return wire.GroupMessage{Op: op, From: wire.MakeStreamTag(1, 1), Grant: 8, RingSize: 4096, Addr: 1 << 40, RKey: 1}
	}
	for _, tc := range []struct {
		name string
		wr   func(opened wire.StreamTag) link.SendWR
	}{
		{"accept for no open", func(wire.StreamTag) link.SendWR {
			g := ring(wire.OpStreamAccept)
			g.To = wire.MakeStreamTag(99, 1)
			return groupMsg(g)
		}},
		{"accept twice", func(opened wire.StreamTag) link.SendWR {
			g := ring(wire.OpStreamAccept)
			g.To = opened
			return groupMsg(g)
		}},
		{"closed without close", func(opened wire.StreamTag) link.SendWR {
			return groupMsg(wire.GroupMessage{Op: wire.OpStreamClosed, To: opened, From: wire.MakeStreamTag(1, 1)})
		}},
		{"close from another stream", func(opened wire.StreamTag) link.SendWR {
			return groupMsg(wire.GroupMessage{Op: wire.OpStreamClose, To: opened, From: wire.MakeStreamTag(2, 1)})
		}},
		{"open with no credit", func(wire.StreamTag) link.SendWR {
			g := ring(wire.OpStreamOpen)
			g.Grant = 0
			return groupMsg(g)
		}},
		{"group message naming a stream", func(opened wire.StreamTag) link.SendWR {
			wr := groupMsg(wire.GroupMessage{Op: wire.OpStreamClose, To: opened, From: wire.MakeStreamTag(1, 1)})
			wire.SetStream(&wr.Msg, opened)
			return wr
		}},
		{"unknown opcode to the group", func(wire.StreamTag) link.SendWR {
			wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: 1}
			wr.Msg[0], wr.Msg[1] = 0x72, 0x99
			return wr
		}},
		{"message to a stream not open", func(wire.StreamTag) link.SendWR {
			wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: 1}
			wire.SetStream(&wr.Msg, wire.MakeStreamTag(500, 3))
			return wr
		}},
		{"message to a stale generation", func(opened wire.StreamTag) link.SendWR {
			wr := link.SendWR{Kind: link.SendControl, Signaled: true, ID: 1}
			wire.SetStream(&wr.Msg, wire.MakeStreamTag(opened.Slot(), opened.Gen()+1))
			return wr
		}},
		{"data to a stream not open", func(opened wire.StreamTag) link.SendWR {
			return link.SendWR{Kind: link.SendMarker, Signaled: true, ID: 1}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, pb := rawPeer(t, group.DefaultConfig())
			// A stream this side opens and the peer accepts.
			ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
			defer cancel()
			opened := make(chan *group.Stream, 1)
			go func() {
				s, err := m.Open(ctx, 9)
				if err != nil {
					t.Error(err)
				}
				opened <- s
			}()
			open := receiveOpen(t, pb)
			acc := ring(wire.OpStreamAccept)
			acc.To = open.From
			linktest.Post(t, pb, groupMsg(acc))
			s := <-opened
			if s == nil {
				t.FailNow()
			}
			defer s.Close()
			wr := tc.wr(open.From)
			if wr.Kind == link.SendMarker {
				// A data write whose immediate names no stream.
				wr = link.SendWR{Kind: link.SendData, Signaled: true, ID: 1, N: 1, Remote: open.Addr, RKey: open.RKey, Tag: uint32(wire.MakeStreamTag(77, 1))}
			}
			linktest.Post(t, pb, wr)
			err := waitErr(t, m)
			if !errors.Is(err, wire.ErrProtocol) {
				t.Errorf("group ended with %v, want a protocol error", err)
			}
			cs := linktest.WaitEnd(t, s)
			if c := cs[len(cs)-1]; c.Kind != link.Failed || !errors.Is(c.Err, wire.ErrProtocol) {
				t.Errorf("stream ended with %v (%v), want the protocol error", c.Kind, c.Err)
			}
			if st := m.Stats(); st.Malformed != 1 {
				t.Errorf("Malformed %d, want 1", st.Malformed)
			}
			if _, err := m.Open(ctx, 9); !errors.Is(err, wire.ErrProtocol) {
				t.Errorf("Open after the group ended: %v", err)
			}
		})
	}
}

// TestStreamOverrunFailsOnlyIt: a peer that sends a stream more than the
// credit it was given fails that stream (link.ErrRNR at both ends), not
// the group.
func TestStreamOverrunFailsOnlyIt(t *testing.T) {
	a, b, _, _ := muxPair(t, group.DefaultConfig(), group.DefaultConfig(), baseConfig())
	x1, y1 := openPair(t, a, b)
	x2, y2 := openPair(t, a, b)
	for _, s := range []*group.Stream{x1, y1, x2, y2} {
		defer s.Close()
	}
	addr, key := y1.RecvRingKey()
	for i := range group.DefaultConfig().FirstGrant + 1 {
		linktest.Post(t, x1, link.SendWR{Kind: link.SendData, Signaled: true, ID: uint64(i + 1), N: 1, Remote: addr, RKey: key})
	}
	for who, s := range map[string]*group.Stream{"receiver": y1, "sender": x1} {
		cs := linktest.WaitEnd(t, s)
		if c := cs[len(cs)-1]; c.Kind != link.Failed || !errors.Is(c.Err, link.ErrRNR) {
			t.Errorf("%s ended with %v (%v), want link.ErrRNR", who, c.Kind, c.Err)
		}
	}
	// The other stream works on.
	linktest.Post(t, x2, linktest.Control(5, 1))
	linktest.WantKinds(t, "y2", linktest.WaitFor(t, y2, 1), "control-arrived")
	if err := a.Err(); err != nil {
		t.Errorf("group a ended: %v", err)
	}
}

// TestOpenBounds: streams past MaxStreams are refused with ErrLimit at the
// opener and ReasonLimit from the peer; past the backlog, ReasonBacklog;
// with no backlog, ReasonNoListener. Each is typed.
func TestOpenBounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	refusedFor := func(err error) uint32 {
		var r *group.RefusedError
		if !errors.As(err, &r) {
			return 0
		}
		return r.Reason
	}
	t.Run("own bound", func(t *testing.T) {
		ca := group.DefaultConfig()
		ca.MaxStreams = 2
		a, b, _, _ := muxPair(t, ca, group.DefaultConfig(), baseConfig())
		openPair(t, a, b)
		openPair(t, a, b)
		if _, err := a.Open(ctx, 7); !errors.Is(err, group.ErrLimit) {
			t.Errorf("third open: %v, want ErrLimit", err)
		}
	})
	t.Run("peer's bound", func(t *testing.T) {
		cb := group.DefaultConfig()
		cb.MaxStreams = 1
		a, b, _, _ := muxPair(t, group.DefaultConfig(), cb, baseConfig())
		openPair(t, a, b)
		if _, err := a.Open(ctx, 7); refusedFor(err) != wire.ReasonLimit {
			t.Errorf("second open: %v, want refused for the peer's bound", err)
		}
	})
	t.Run("backlog", func(t *testing.T) {
		cb := group.DefaultConfig()
		cb.Backlog = 1
		a, _, _, _ := muxPair(t, group.DefaultConfig(), cb, baseConfig())
		if _, err := a.Open(ctx, 7); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Open(ctx, 7); refusedFor(err) != wire.ReasonBacklog {
			t.Errorf("open past the backlog: %v, want refused for the backlog", err)
		}
	})
	t.Run("no listener", func(t *testing.T) {
		cb := group.DefaultConfig()
		cb.Backlog = 0
		a, _, _, _ := muxPair(t, group.DefaultConfig(), cb, baseConfig())
		if _, err := a.Open(ctx, 7); refusedFor(err) != wire.ReasonNoListener {
			t.Errorf("open: %v, want refused: no listener", err)
		}
	})
}

// TestRetire: a retired group refuses new streams (nothing listens), ends
// the streams nobody accepted, keeps those accepted, and closes its link
// once the last of them closes.
func TestRetire(t *testing.T) {
	a, b, _, _ := muxPair(t, group.DefaultConfig(), group.DefaultConfig(), baseConfig())
	x, y := openPair(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	queued, err := a.Open(ctx, 7) // accepted by b's group, not by b.Accept
	if err != nil {
		t.Fatal(err)
	}
	b.Retire()
	if _, err := b.Accept(ctx); !errors.Is(err, group.ErrClosed) {
		t.Errorf("Accept after Retire: %v, want ErrClosed", err)
	}
	var refused *group.RefusedError
	if _, err := a.Open(ctx, 7); !errors.As(err, &refused) || refused.Reason != wire.ReasonNoListener {
		t.Errorf("open after Retire: %v, want refused: nothing listens", err)
	}
	linktest.CheckEnd(t, "the stream nobody accepted", linktest.WaitEnd(t, queued), nil)
	queued.Close()
	// The accepted stream works on.
	linktest.Post(t, x, linktest.Control(1, 1))
	linktest.WantKinds(t, "y", linktest.WaitFor(t, y, 1), "control-arrived")
	if err := b.Err(); err != nil {
		t.Fatalf("retired group ended with a stream open: %v", err)
	}
	y.Close()
	x.Close()
	if err := waitErr(t, b); !errors.Is(err, group.ErrClosed) {
		t.Errorf("retired group ended with %v, want ErrClosed", err)
	}
	if err := waitErr(t, a); !errors.Is(err, group.ErrDown) {
		t.Errorf("the peer's group ended with %v, want ErrDown", err)
	}
}

// TestIdleClose: a group with IdleClose closes once it has had no stream
// for that long, not while one is open; its peer's group ends with it.
func TestIdleClose(t *testing.T) {
	const idle = 50 * time.Millisecond
	ca := group.DefaultConfig()
	ca.IdleClose = idle
	a, b, _, _ := muxPair(t, ca, group.DefaultConfig(), baseConfig())
	x, y := openPair(t, a, b)
	time.Sleep(4 * idle)
	if err := a.Err(); err != nil {
		t.Fatalf("group with a stream open ended: %v", err)
	}
	x.Close()
	y.Close()
	if err := waitErr(t, a); !errors.Is(err, group.ErrClosed) {
		t.Errorf("idle group ended with %v, want ErrClosed", err)
	}
	if err := waitErr(t, b); !errors.Is(err, group.ErrDown) {
		t.Errorf("its peer ended with %v, want ErrDown", err)
	}
}

// TestCloseKeepsRingsForOpenStreams: a group that ends keeps its link,
// which owns the streams' rings, until its last stream is closed: a
// connection may still read what arrived (over RDMA, a ring given back
// with the link is unmapped, and reading it faulted in the lab).
func TestCloseKeepsRingsForOpenStreams(t *testing.T) {
	a, b, _, pb := muxPair(t, group.DefaultConfig(), group.DefaultConfig(), baseConfig())
	x, y := openPair(t, a, b)
	copy(x.SendRing(), "hello")
	linktest.Post(t, x, linktest.Data(y, 0, 5, 0, true, 1))
	linktest.WantKinds(t, "y", linktest.WaitFor(t, y, 1), "data-arrived 5")
	a.Close()
	waitErr(t, b)
	b.Close() // as the group's owner does when it ended
	if err := pb.PostRecv(0); err != nil {
		t.Fatalf("the link was closed with a stream open: %v", err)
	}
	if got := string(y.RecvRing()[:5]); got != "hello" {
		t.Fatalf("the open stream's ring holds %q", got)
	}
	linktest.CheckEnd(t, "y", linktest.WaitEnd(t, y), nil)
	y.Close()
	x.Close()
	deadline := time.Now().Add(linktest.HangGuard)
	for pb.PostRecv(0) == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := pb.PostRecv(0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the link after its last stream closed: %v, want it closed", err)
	}
}

// TestManyCloseAtOnce: both sides close 48 streams at once, more than the
// group's requests in flight, so closes wait for room: a side that learns
// of the peer's close while its own waits sends none (its answer would go
// before it, and the peer would give the slot back first). Both groups
// live on, and every slot comes back.
func TestManyCloseAtOnce(t *testing.T) {
	a, b, _, _ := muxPair(t, group.DefaultConfig(), group.DefaultConfig(), baseConfig())
	const n = 48 // of the 62 the base pipe's receives allow
	var xs, ys []*group.Stream
	for range n {
		x, y := openPair(t, a, b)
		xs, ys = append(xs, x), append(ys, y)
	}
	var wg sync.WaitGroup
	for _, s := range append(xs, ys...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Close()
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(linktest.HangGuard)
	for a.Stats().Streams+b.Stats().Streams > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for name, m := range map[string]*group.Mux{"a": a, "b": b} {
		if err := m.Err(); err != nil {
			t.Errorf("group %s ended: %v", name, err)
		}
		if st := m.Stats(); st.Streams != 0 {
			t.Errorf("group %s: %d streams left", name, st.Streams)
		}
	}
	// The group still opens streams.
	openPair(t, a, b)
}

// TestEndFreesStreamsNobodyHolds: when a group ends, the streams the peer
// opened that nobody accepted, and an open its opener gave up on, are
// nobody's to close: the group frees them itself, and its link closes
// with the streams that were handed out.
func TestEndFreesStreamsNobodyHolds(t *testing.T) {
	a, b, pa, pb := muxPair(t, group.DefaultConfig(), group.DefaultConfig(), baseConfig())
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	held, err := a.Open(ctx, 7) // b's to accept; nobody does
	if err != nil {
		t.Fatal(err)
	}
	x, y := openPair(t, a, b)
	gone, stop := context.WithCancel(ctx)
	stop()
	if _, err := a.Open(gone, 7); err == nil {
		t.Fatal("an open with a context that ended succeeded")
	}
	// An open whose opener gives up before the answer comes.
	pb.SetDelay(200 * time.Millisecond)
	soon, stop := context.WithTimeout(ctx, 20*time.Millisecond)
	defer stop()
	if _, err := a.Open(soon, 7); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an open whose answer came after its context ended: %v, want %v", err, context.DeadlineExceeded)
	}
	pb.SetDelay(0)
	b.Close()
	waitErr(t, a)
	a.Close()
	x.Close()
	y.Close()
	held.Close()
	deadline := time.Now().Add(linktest.HangGuard)
	for (a.Stats().Streams > 0 || b.Stats().Streams > 0) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if sa, sb := a.Stats().Streams, b.Stats().Streams; sa+sb > 0 {
		t.Errorf("%d and %d streams left once every holder closed", sa, sb)
	}
	for pa.PostRecv(0) == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := pa.PostRecv(0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a's link after its last stream: %v, want it closed", err)
	}
}
