// Package linktest is the conformance suite of link.Link: what every link
// must do, whatever carries it (the in-memory link.Pipe, tcplink over a
// socket, a group's streams, the session link, and rdmalink in the lab).
// An implementation's tests call Run with a function that makes a
// connected pair (RunWith, with the Options its transport needs); what is
// particular to one link (its faults, its statistics, its hostile peers)
// stays in its own tests.
//
// The model is golang.org/x/net/nettest's TestConn: one suite, run against
// every implementation, so that the engine above the seam can count on the
// same behaviour from each.
package linktest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// HangGuard bounds every wait in the suite. It only turns a hang into a
// failure: no test compares how long something took against a bound.
const HangGuard = 60 * time.Second

// Spec sizes one end of a pair.
type Spec struct {
	SendRing, RecvRing                 int
	SendDepth, RecvDepth, ControlDepth int
}

// DefaultSpec is what most of the suite's pairs have at each end.
func DefaultSpec() Spec {
	return Spec{SendRing: 4096, RecvRing: 4096, SendDepth: 8, RecvDepth: 4, ControlDepth: 2}
}

// MakePair returns two connected ends sized as a and b, whose receives are
// all posted, and whose messages beyond the receives posted wait for more
// (receiver not ready, retried), as rdmanet's RDMA links are set up. The
// pair is closed when the test ends; the function checks for leaks then,
// if it can.
type MakePair func(t *testing.T, a, b Spec) (link.Link, link.Link)

// Options tell the suite what a link does not promise because its
// transport does not. Each relaxes one rule of the suite's model (the
// in-memory link.Pipe), says which and why, and has the suite check the
// weaker rule in its place: none skips a test. The zero Options are the
// model's rules.
type Options struct {
	// ZeroLengthUnchecked: a write of zero bytes (a marker, or data of N
	// 0) is not checked against the peer's rings: whatever address and
	// key it names, it lands nowhere and completes, and the link goes on.
	// InfiniBand does not require a zero-byte RDMA operation to carry a
	// valid address or key (rxe skips the check), and neither does siw
	// (iWARP): rdmalink's markers name no memory the device checks.
	ZeroLengthUnchecked bool
	// EndWakes: Wait on a link whose end (Disconnected or Failed) has
	// come returns link.ErrWoken at once, not nil; either way it returns,
	// and the caller polls. rdmalink's end wakes a Wait as Wake does
	// (its own tests hold it to that), and rdmanet's callers take both
	// alike.
	EndWakes bool
	// DisconnectAnswered: the end that called Disconnect reports
	// Disconnected once the peer answered, not as soon as Disconnect
	// returned, so the suite waits for it rather than poll for it. On
	// RDMA, rdma_cm's DISCONNECTED comes to the initiator with the
	// peer's reply (or its time-out); what arrived before still comes
	// first.
	DisconnectAnswered bool
	// RefusalEnds: a request the peer refuses (a write outside its rings
	// or with a key it does not have; on a RecvCredit link, a message
	// beyond its credit) ends the link at both ends, after what came
	// before it, as Disconnected or as Failed matching the cause
	// (link.ErrRemoteAccess, link.ErrRNR), never link.ErrDown; and the
	// refused request and those after it may complete at the sender
	// first. iWARP (siw): the refusing end sends a TERMINATE and closes
	// the connection, which rdma_cm reports as DISCONNECTED at both ends
	// (only a write past a ring raises QP_ACCESS_ERR there, and nothing
	// at the sender), and a send completes once it is on the wire, before
	// the peer has seen it. There the sender may also fail the refused
	// request as a local QP operation error, which says link.ErrDown: the
	// peer's TERMINATE moved its queue pair to error first (seen once in a
	// loaded make test, and once before; RefusedEndAtSender).
	RefusalEnds bool
}

// Run runs the suite, each test a subtest of t.
func Run(t *testing.T, pair MakePair) { RunWith(t, pair, Options{}) }

// RunWith runs the suite with opts, each test a subtest of t.
func RunWith(t *testing.T, pair MakePair, opts Options) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, MakePair, Options)
	}{
		{"DataLandsInOrder", testDataLandsInOrder},
		{"ControlAndMarker", testControlAndMarker},
		{"OrderAcrossKinds", testOrderAcrossKinds},
		{"SignaledOnly", testSignaledOnly},
		{"Misuse", testMisuse},
		{"Outstanding", testOutstanding},
		{"ReceiverNotReady", testReceiverNotReady},
		{"RemoteAccessError", testRemoteAccessError},
		{"Disconnect", testDisconnect},
		{"DisconnectAfterArrived", testDisconnectAfterArrived},
		{"PeerClosed", testPeerClosed},
		{"WaitWake", testWaitWake},
		{"UseAfterClose", testUseAfterClose},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, pair, opts) })
	}
}

func testDataLandsInOrder(t *testing.T, pair MakePair, opts Options) {
	sb := DefaultSpec()
	sb.RecvDepth = 8
	a, b := pair(t, DefaultSpec(), sb)
	Fill(a.SendRing(), 1)
	Post(t, a,
		Data(b, 0, 100, 1000, false, 1),
		Data(b, 100, 50, 0, true, 2),
		Data(b, 200, 0, 4096, false, 3), // zero bytes, at the ring's end
		Data(b, 300, 30, 4066, true, 4),
		Data(b, 1000, 3000, 1050, true, 5), // large: written from the ring, not inlined
	)
	WantKinds(t, "b", WaitFor(t, b, 5), "data-arrived 100", "data-arrived 50", "data-arrived 0", "data-arrived 30", "data-arrived 3000")
	WantKinds(t, "a", WaitFor(t, a, 3), "send-done 2", "send-done 4", "send-done 5")
	s, r := a.SendRing(), b.RecvRing()
	if !bytes.Equal(r[1000:1050], s[0:50]) || !bytes.Equal(r[0:50], s[100:150]) ||
		!bytes.Equal(r[4066:], s[300:330]) || !bytes.Equal(r[1050:4050], s[1000:4000]) {
		t.Error("data landed at the wrong offsets")
	}
	if !bytes.Equal(r[50:1000], make([]byte, 950)) || !bytes.Equal(r[4050:4066], make([]byte, 16)) {
		t.Error("bytes outside the writes changed")
	}
}

// Control messages arrive whole and in order; markers land and complete,
// and take no receive: b has two posted, for the two control messages, and
// reposts none (were a marker to take one, the second message would wait
// for a receive for ever).
func testControlAndMarker(t *testing.T, pair MakePair, opts Options) {
	sb := DefaultSpec()
	sb.RecvDepth = 2
	a, b := pair(t, DefaultSpec(), sb)
	Post(t, a, Control(1, 0xa0), Marker(b, 2))
	Post(t, a, Control(3, 0xb0))
	Post(t, a, link.SendWR{Kind: link.SendMarker, Remote: 0, RKey: 0, N: 5}) // unsignaled, and at no ring
	cs := WaitFor(t, b, 2)
	WantKinds(t, "b", cs, "control-arrived", "control-arrived")
	if cs[0].Msg != Control(0, 0xa0).Msg || cs[1].Msg != Control(0, 0xb0).Msg {
		t.Errorf("messages %x and %x", cs[0].Msg, cs[1].Msg)
	}
	if opts.ZeroLengthUnchecked {
		// The unsignaled marker with a bad address lands nowhere: a
		// signaled one after it completes, and nothing comes to b.
		WantKinds(t, "a", WaitFor(t, a, 3), "send-done 1", "send-done 2", "send-done 3")
		Post(t, a, Marker(b, 4))
		WantKinds(t, "a", WaitFor(t, a, 1), "send-done 4")
		if cs := PollAll(t, b); len(cs) != 0 {
			t.Errorf("b got %q for markers", Kinds(cs))
		}
		return
	}
	// The unsignaled marker with a bad address fails both ends after the
	// rest.
	WantKinds(t, "a", WaitFor(t, a, 4), "send-done 1", "send-done 2", "send-done 3", "failed")
	WantKinds(t, "b", WaitFor(t, b, 1), "failed")
}

// Order holds across kinds: data, control and markers land in post order.
func testOrderAcrossKinds(t *testing.T, pair MakePair, opts Options) {
	sa, sb := DefaultSpec(), DefaultSpec()
	sa.SendDepth, sa.ControlDepth, sb.RecvDepth = 64, 64, 64
	a, b := pair(t, sa, sb)
	Fill(a.SendRing(), 3)
	var wrs []link.SendWR
	var want []string
	for i := range 60 {
		switch i % 3 {
		case 0:
			wrs = append(wrs, Data(b, uint32(i), uint32(i+1), uint32(i*10), i%2 == 0, uint64(i)))
			want = append(want, fmt.Sprintf("data-arrived %d", i+1))
		case 1:
			wrs = append(wrs, Control(uint64(i), byte(i)))
			want = append(want, "control-arrived")
		case 2:
			wrs = append(wrs, Marker(b, uint64(i)))
		}
	}
	Post(t, a, wrs[:30]...)
	Post(t, a, wrs[30:]...)
	cs := WaitFor(t, b, len(want))
	WantKinds(t, "b", cs, want...)
	for i, c := range cs {
		if c.Kind == link.ControlArrived && c.Msg != Control(0, byte(i/2*3+1)).Msg {
			t.Errorf("control message %d: %x", i, c.Msg)
		}
	}
	var done []string
	for _, wr := range wrs {
		if wr.Signaled {
			done = append(done, fmt.Sprintf("send-done %d", wr.ID))
		}
	}
	WantKinds(t, "a", WaitFor(t, a, len(done)), done...)
}

func testSignaledOnly(t *testing.T, pair MakePair, opts Options) {
	a, b := pair(t, DefaultSpec(), DefaultSpec())
	Post(t, a, Data(b, 0, 1, 0, false, 1), Marker(b, 2), Data(b, 0, 1, 0, false, 3), Data(b, 0, 1, 0, true, 4))
	m := Marker(b, 5)
	m.Signaled = false
	Post(t, a, m)
	WaitFor(t, b, 3)
	WantKinds(t, "a", WaitFor(t, a, 2), "send-done 2", "send-done 4")
	// The last marker landed too: a control message after it completes,
	// and nothing comes for the marker.
	Post(t, a, Control(6, 0))
	WantKinds(t, "a", WaitFor(t, a, 1), "send-done 6")
}

// Calls that break the contract fail with link.ErrMisuse.
func testMisuse(t *testing.T, pair MakePair, opts Options) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, a, b link.Link) error
	}{
		{"send depth", func(t *testing.T, a, b link.Link) error {
			var wrs []link.SendWR
			for range 9 {
				wrs = append(wrs, Marker(b, 1))
			}
			return a.PostSend(wrs)
		}},
		{"send depth across posts", func(t *testing.T, a, b link.Link) error {
			for range 8 {
				if err := a.PostSend([]link.SendWR{Marker(b, 1)}); err != nil {
					return fmt.Errorf("below the depth: %v", err)
				}
			}
			return a.PostSend([]link.SendWR{Marker(b, 1)})
		}},
		{"control depth", func(t *testing.T, a, b link.Link) error {
			return a.PostSend([]link.SendWR{Control(1, 0), Control(2, 0), Control(3, 0)})
		}},
		{"unsignaled control", func(t *testing.T, a, b link.Link) error {
			wr := Control(1, 0)
			wr.Signaled = false
			return a.PostSend([]link.SendWR{wr})
		}},
		{"data past the send ring", func(t *testing.T, a, b link.Link) error {
			return a.PostSend([]link.SendWR{Data(b, 4000, 97, 0, true, 1)})
		}},
		{"data offset overflow", func(t *testing.T, a, b link.Link) error {
			return a.PostSend([]link.SendWR{Data(b, 1<<32-1, 2, 0, true, 1)})
		}},
		{"kind", func(t *testing.T, a, b link.Link) error {
			return a.PostSend([]link.SendWR{{Kind: 0, Signaled: true}})
		}},
		{"receives beyond the depth", func(t *testing.T, a, b link.Link) error {
			return a.PostRecv(1)
		}},
		{"negative receives", func(t *testing.T, a, b link.Link) error {
			return a.PostRecv(-1)
		}},
		{"receives beyond the depth after use", func(t *testing.T, a, b link.Link) error {
			Post(t, b, Data(a, 0, 1, 0, true, 1))
			WaitFor(t, a, 1)
			if err := a.PostRecv(1); err != nil {
				return fmt.Errorf("below the depth: %v", err)
			}
			return a.PostRecv(1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, DefaultSpec(), DefaultSpec())
			if err := tc.do(t, a, b); !errors.Is(err, link.ErrMisuse) {
				t.Fatalf("got %v, want an error matching link.ErrMisuse", err)
			}
		})
	}
}

// A request stays outstanding until its own SendDone, or a later signaled
// one's, is taken by Poll: not when it lands.
func testOutstanding(t *testing.T, pair MakePair, opts Options) {
	sa, sb := DefaultSpec(), DefaultSpec()
	sa.SendDepth, sb.RecvDepth = 4, 16
	a, b := pair(t, sa, sb)
	Post(t, a, Data(b, 0, 1, 0, false, 1), Marker(b, 2), Data(b, 0, 1, 0, false, 3), Marker(b, 4))
	WaitFor(t, b, 2)
	if err := a.PostSend([]link.SendWR{Marker(b, 5)}); !errors.Is(err, link.ErrMisuse) {
		t.Fatalf("fifth request with 4 landed but not taken: %v, want link.ErrMisuse", err)
	}
	WantKinds(t, "a", WaitFor(t, a, 1), "send-done 2")
	Post(t, a, Marker(b, 5), Marker(b, 6)) // the first two retired
	if err := a.PostSend([]link.SendWR{Marker(b, 7)}); !errors.Is(err, link.ErrMisuse) {
		t.Fatalf("fifth request: %v, want link.ErrMisuse", err)
	}
	WantKinds(t, "a", WaitFor(t, a, 3), "send-done 4", "send-done 5", "send-done 6")
	Post(t, a, Marker(b, 7), Marker(b, 8), Marker(b, 9), Marker(b, 10))

	// Control requests: ControlDepth 2, retired by their own SendDone or a
	// later one's.
	WantKinds(t, "a", WaitFor(t, a, 4), "send-done 7", "send-done 8", "send-done 9", "send-done 10")
	Post(t, a, Control(11, 0), Control(12, 0))
	if err := a.PostSend([]link.SendWR{Control(13, 0)}); !errors.Is(err, link.ErrMisuse) {
		t.Fatalf("third control: %v, want link.ErrMisuse", err)
	}
	WaitFor(t, a, 2)
	Post(t, a, Control(13, 0), Marker(b, 14))
	WaitFor(t, a, 2)
	Post(t, a, Control(15, 0))
}

// Receiver not ready: messages beyond the receives the peer has posted
// wait until it posts more; then they land in order. A send completes
// only once its message landed.
func testReceiverNotReady(t *testing.T, pair MakePair, opts Options) {
	sb := DefaultSpec()
	sb.RecvDepth = 2
	a, b := pair(t, DefaultSpec(), sb)
	if b.Caps().RecvCredit {
		creditOverrun(t, a, b, opts)
		return
	}
	Fill(a.SendRing(), 9)
	for i := range 6 {
		Post(t, a, Data(b, uint32(i*100), 100, uint32(i*100), true, uint64(i+1)))
	}
	WantKinds(t, "b", WaitFor(t, b, 2), "data-arrived 100", "data-arrived 100")
	WantKinds(t, "a", WaitFor(t, a, 2), "send-done 1", "send-done 2")
	// A control message from b arrives at a with no completion for the
	// messages that found no receive.
	Post(t, b, Control(100, 0))
	WantKinds(t, "a", WaitFor(t, a, 1), "control-arrived")
	if cs := PollAll(t, a); len(cs) != 0 {
		t.Fatalf("a got %q while b had no receive posted", Kinds(cs))
	}
	// b's control completes once a took it, which on some links is
	// reported behind the data that found no receive: it may come at
	// any point until the data is taken, so it is set apart.
	controlDone := false
	bArrivals := func(cs []link.Completion) []link.Completion {
		var rest []link.Completion
		for _, c := range cs {
			if !controlDone && c.Kind == link.SendDone && c.ID == 100 {
				controlDone = true
				continue
			}
			rest = append(rest, c)
		}
		return rest
	}
	if cs := bArrivals(PollAll(t, b)); len(cs) != 0 {
		t.Fatalf("b got %q with no receive posted", Kinds(cs))
	}
	for i := 2; i < 6; i += 2 {
		if err := b.PostRecv(2); err != nil {
			t.Fatal(err)
		}
		var got []link.Completion
		for len(got) < 2 {
			got = append(got, bArrivals(WaitFor(t, b, 1))...)
		}
		WantKinds(t, "b", got, "data-arrived 100", "data-arrived 100")
		WantKinds(t, "a", WaitFor(t, a, 2), fmt.Sprintf("send-done %d", i+1), fmt.Sprintf("send-done %d", i+2))
	}
	if !controlDone {
		WantKinds(t, "b", WaitFor(t, b, 1), "send-done 100")
	}
	if !bytes.Equal(b.RecvRing()[:600], a.SendRing()[:600]) {
		t.Error("bytes differ")
	}
}

// creditOverrun: on a link whose messages need credit (Caps.RecvCredit,
// as on iWARP and a group's streams), a message beyond the receives the
// peer posted fails both ends with link.ErrRNR, after what came before.
func creditOverrun(t *testing.T, a, b link.Link, opts Options) {
	Fill(a.SendRing(), 9)
	for i := range 3 {
		Post(t, a, Data(b, uint32(i*100), 100, uint32(i*100), true, uint64(i+1)))
	}
	if opts.RefusalEnds {
		RefusedEnd(t, "b", WaitEnd(t, b), link.ErrRNR, []string{"data-arrived 100", "data-arrived 100"})
		RefusedEndAtSender(t, "a", WaitEnd(t, a), link.ErrRNR, nil, "send-done 1", "send-done 2", "send-done 3")
		return
	}
	cb := WaitEnd(t, b)
	CheckEndWith(t, "b", cb, "failed", []string{"data-arrived 100", "data-arrived 100"})
	if c := cb[len(cb)-1]; c.Kind != link.Failed || !errors.Is(c.Err, link.ErrRNR) {
		t.Errorf("b ended with %v (%v), want a failure matching link.ErrRNR", c.Kind, c.Err)
	}
	ca := WaitEnd(t, a)
	CheckEndWith(t, "a", ca, "failed", nil, "send-done 1", "send-done 2", "send-done 3")
	if c := ca[len(ca)-1]; c.Kind != link.Failed || !errors.Is(c.Err, link.ErrRNR) {
		t.Errorf("a ended with %v (%v), want a failure matching link.ErrRNR", c.Kind, c.Err)
	}
}

// A write outside the peer's ring, or with the wrong key, fails both ends
// with link.ErrRemoteAccess (not a lost path), after what came before it.
func testRemoteAccessError(t *testing.T, pair MakePair, opts Options) {
	for _, tc := range []struct {
		name   string
		bad    func(b link.Link) link.SendWR
		marker bool // writes zero bytes
	}{
		{"wrong key", func(b link.Link) link.SendWR { wr := Data(b, 0, 10, 0, true, 2); wr.RKey++; return wr }, false},
		{"past the ring", func(b link.Link) link.SendWR { return Data(b, 0, 10, 4090, true, 2) }, false},
		{"far past the ring", func(b link.Link) link.SendWR { return Data(b, 0, 10, 1<<31, true, 2) }, false},
		{"offset as address", func(b link.Link) link.SendWR { wr := Data(b, 0, 10, 0, true, 2); wr.Remote = 100; return wr }, false},
		{"marker with the wrong key", func(b link.Link) link.SendWR { wr := Marker(b, 2); wr.RKey++; return wr }, true},
		{"marker past the ring", func(b link.Link) link.SendWR { wr := Marker(b, 2); wr.Remote += 4097; return wr }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, DefaultSpec(), DefaultSpec())
			Post(t, a, Data(b, 0, 10, 0, true, 1), tc.bad(b), Data(b, 0, 10, 0, true, 3))
			if tc.marker && opts.ZeroLengthUnchecked {
				// The marker lands nowhere, and the link goes on.
				WantKinds(t, "a", WaitFor(t, a, 3), "send-done 1", "send-done 2", "send-done 3")
				WantKinds(t, "b", WaitFor(t, b, 2), "data-arrived 10", "data-arrived 10")
				return
			}
			if opts.RefusalEnds {
				RefusedEndAtSender(t, "a", WaitEnd(t, a), link.ErrRemoteAccess, []string{"send-done 1"}, "send-done 2", "send-done 3")
				RefusedEnd(t, "b", WaitEnd(t, b), link.ErrRemoteAccess, []string{"data-arrived 10"})
				return
			}
			ca := WaitFor(t, a, 2)
			WantKinds(t, "a", ca, "send-done 1", "failed")
			cb := WaitFor(t, b, 2)
			WantKinds(t, "b", cb, "data-arrived 10", "failed")
			for who, c := range map[string]link.Completion{"a": ca[len(ca)-1], "b": cb[len(cb)-1]} {
				if !errors.Is(c.Err, link.ErrRemoteAccess) || errors.Is(c.Err, link.ErrDown) {
					t.Errorf("%s's error: %v, want a remote access error", who, c.Err)
				}
			}
			if cs := append(PollAll(t, a), PollAll(t, b)...); len(cs) != 0 {
				t.Errorf("completions after the failure: %q", Kinds(cs))
			}
		})
	}
}

// Disconnect from either end: what the ends had received comes first, then
// Disconnected; requests not written are flushed; requests after it are
// flushed too.
func testDisconnect(t *testing.T, pair MakePair, opts Options) {
	for _, who := range []string{"initiator", "peer"} {
		t.Run(who, func(t *testing.T) {
			a, b := pair(t, DefaultSpec(), DefaultSpec())
			// b sent a something that a has not polled yet.
			Post(t, b, Data(a, 0, 7, 0, true, 1))
			WantKinds(t, "b", WaitFor(t, b, 1), "send-done 1")
			// a sent b something that landed.
			Post(t, a, Data(b, 0, 5, 0, true, 1))
			WantKinds(t, "a", WaitFor(t, a, 2), "data-arrived 7", "send-done 1")
			Post(t, b, Data(a, 0, 8, 0, true, 2))
			WantKinds(t, "b", WaitFor(t, b, 2), "data-arrived 5", "send-done 2")
			// a has 8 bytes from b to poll; b's request 3 and a's request 2
			// may or may not land.
			Post(t, b, Data(a, 0, 9, 0, true, 3))
			Post(t, a, Data(b, 0, 6, 0, true, 2))
			x, y := a, b
			if who == "peer" {
				x, y = b, a
			}
			if err := x.Disconnect(); err != nil {
				t.Fatal(err)
			}
			if err := x.Disconnect(); err != nil {
				t.Fatalf("second Disconnect: %v", err)
			}
			// Posted after it: flushed, and not counted (more than
			// SendDepth is fine).
			for range 3 {
				Post(t, x, Marker(y, 9), Marker(y, 9), Marker(y, 9), Marker(y, 9))
			}
			ca, cb := WaitEnd(t, a), WaitEnd(t, b)
			// a had 8 bytes from b to poll: they come first. What was in
			// flight may or may not have landed or completed; Disconnected
			// is last.
			CheckEnd(t, "a", ca, []string{"data-arrived 8"}, "data-arrived 9", "send-done 2")
			CheckEnd(t, "b", cb, nil, "data-arrived 6", "send-done 3")
			// Nothing more is posted or delivered; calls still work.
			Post(t, x, Marker(y, 10))
			if err := y.Disconnect(); err != nil {
				t.Fatalf("Disconnect after the peer's: %v", err)
			}
			if err := a.Wait(); err != nil && !(opts.EndWakes && err == link.ErrWoken) {
				t.Fatalf("Wait on a link that is down: %v", err)
			}
		})
	}
}

// The initiator of a Disconnect reports Disconnected after what had
// arrived, even if it arrived unpolled.
func testDisconnectAfterArrived(t *testing.T, pair MakePair, opts Options) {
	a, b := pair(t, DefaultSpec(), DefaultSpec())
	if err := a.Arm(); err != nil {
		t.Fatal(err)
	}
	Post(t, b, Control(1, 0))
	guard := time.AfterFunc(HangGuard, a.Wake)
	defer guard.Stop()
	if err := a.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := a.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if opts.DisconnectAnswered {
		WantKinds(t, "a", WaitEnd(t, a), "control-arrived", "disconnected")
	} else {
		WantKinds(t, "a", PollAll(t, a), "control-arrived", "disconnected")
	}
	WantKinds(t, "b", WaitEnd(t, b), "send-done 1", "disconnected")
}

// A peer whose link is closed without Disconnect (its process died) is
// gone: Disconnected, not a path failure, after what it sent before.
func testPeerClosed(t *testing.T, pair MakePair, opts Options) {
	a, b := pair(t, DefaultSpec(), DefaultSpec())
	Post(t, b, Data(a, 0, 100, 0, true, 1), Control(2, 0))
	WantKinds(t, "b", WaitFor(t, b, 2), "send-done 1", "send-done 2")
	Post(t, a, Data(b, 0, 100, 0, true, 1)) // may or may not land
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	CheckEnd(t, "a", WaitEnd(t, a), []string{"data-arrived 100", "control-arrived"}, "send-done 1")
}

// Wait, Arm and Wake: a Wake before Wait makes the next Wait return
// ErrWoken; a completion after Arm ends a Wait; Close ends a Wait.
func testWaitWake(t *testing.T, pair MakePair, opts Options) {
	a, b := pair(t, DefaultSpec(), DefaultSpec())
	a.Wake()
	if err := a.Wait(); err != link.ErrWoken {
		t.Fatalf("Wait after Wake: %v", err)
	}
	a.Arm()
	done := make(chan error, 1)
	go func() { done <- a.Wait() }()
	Post(t, b, Control(1, 0))
	if err := <-done; err != nil {
		t.Fatalf("Wait for a completion: %v", err)
	}
	a.Arm()
	go func() { done <- a.Wait() }()
	a.Wake()
	if err := <-done; err != link.ErrWoken {
		t.Fatalf("Wait woken: %v", err)
	}
	a.Arm()
	go func() { done <- a.Wait() }()
	a.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Wait ended by Close: %v", err)
	}
}

func testUseAfterClose(t *testing.T, pair MakePair, opts Options) {
	a, b := pair(t, DefaultSpec(), DefaultSpec())
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for name, err := range map[string]error{
		"PostSend":   a.PostSend([]link.SendWR{Marker(b, 1)}),
		"PostRecv":   a.PostRecv(0),
		"Poll":       func() error { _, err := a.Poll(make([]link.Completion, 1)); return err }(),
		"Arm":        a.Arm(),
		"Wait":       a.Wait(),
		"Disconnect": a.Disconnect(),
	} {
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s after Close: %v, want net.ErrClosed", name, err)
		}
	}
	a.Wake()
	WantKinds(t, "b", WaitEnd(t, b), "disconnected")
}

// PipePair is MakePair over the in-memory link: two pipes, with
// receiver-not-ready retried for ever (RNRRetry 7), as NewPipes makes
// them.
func PipePair(t *testing.T, a, b Spec) (*link.Pipe, *link.Pipe) {
	return NewPipes(t, pipeConfig(a), pipeConfig(b))
}

// NewPipes returns a connected pair of pipes configured as a and b,
// closed when the test ends, after which t fails if goroutines outlive
// them.
func NewPipes(t testing.TB, a, b link.PipeConfig) (*link.Pipe, *link.Pipe) {
	t.Helper()
	CheckGoroutines(t)
	pa, pb := link.NewPipe(a, b)
	t.Cleanup(func() {
		pa.Close()
		pb.Close()
	})
	return pa, pb
}

func pipeConfig(s Spec) link.PipeConfig {
	return link.PipeConfig{
		SendRing: s.SendRing, RecvRing: s.RecvRing,
		SendDepth: s.SendDepth, RecvDepth: s.RecvDepth, ControlDepth: s.ControlDepth,
		RNRRetry: 7,
	}
}
