package tcplink

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

func TestCapsAddrsKeys(t *testing.T) {
	ca, cb := connPair(t, "tcp")
	sb := spec{sendRing: 100, recvRing: 200, sendDepth: 3, recvDepth: 5, controlDepth: 1}
	a, b := newLinks(t, ca, cb, testSpec(), sb)
	if got, want := b.Caps(), (link.Caps{SendDepth: 3, RecvDepth: 5, ControlDepth: 1, Name: "tcp", Transport: "tcp"}); got != want {
		t.Errorf("Caps: %+v, want %+v", got, want)
	}
	if len(b.SendRing()) != 100 || len(b.RecvRing()) != 200 {
		t.Errorf("rings: %d and %d bytes, want 100 and 200", len(b.SendRing()), len(b.RecvRing()))
	}
	al, ar := a.Addrs()
	bl, br := b.Addrs()
	if al != ca.LocalAddr().(*net.TCPAddr).AddrPort() || ar != bl || br != al || !al.Addr().Is4() {
		t.Errorf("addresses: a %v->%v, b %v->%v; socket %v->%v", al, ar, bl, br, ca.LocalAddr(), ca.RemoteAddr())
	}
	aa, ak := a.RecvRingKey()
	ba, bk := b.RecvRingKey()
	if aa != RingAddr || ba != RingAddr || ak == bk {
		t.Errorf("ring keys (%#x, %#x) and (%#x, %#x)", aa, ak, ba, bk)
	}

	pa, pb := connPair(t, "pipe")
	cfg := testSpec().config()
	cfg.Name = "tcp 10.0.0.1"
	p, err := New(pa, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	defer pb.Close()
	if l, r := p.Addrs(); l != (netip.AddrPort{}) || r != (netip.AddrPort{}) {
		t.Errorf("net.Pipe's addresses: %v, %v, want zero", l, r)
	}
	if p.Caps().Name != "tcp 10.0.0.1" {
		t.Errorf("name %q", p.Caps().Name)
	}
}

func TestNewRejectsNegativeDepth(t *testing.T) {
	ca, _ := connPair(t, "pipe")
	if _, err := New(ca, Config{SendDepth: -1}); err == nil {
		t.Fatal("New with a negative depth succeeded")
	}
}

func TestDataLandsInOrder(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		sb := testSpec()
		sb.recvDepth = 8
		a, b := newPair(t, tr, testSpec(), sb)
		fill(a.SendRing(), 1)
		post(t, a,
			data(b, 0, 100, 1000, false, 1),
			data(b, 100, 50, 0, true, 2),
			data(b, 200, 0, 4096, false, 3), // zero bytes, at the ring's end
			data(b, 300, 30, 4066, true, 4),
			data(b, 1000, 3000, 1050, true, 5), // large: written from the ring, not inlined
		)
		wantKinds(t, "b", waitFor(t, b, 5), "data-arrived 100", "data-arrived 50", "data-arrived 0", "data-arrived 30", "data-arrived 3000")
		wantKinds(t, "a", waitFor(t, a, 3), "send-done 2", "send-done 4", "send-done 5")
		s, r := a.SendRing(), b.RecvRing()
		if !bytes.Equal(r[1000:1050], s[0:50]) || !bytes.Equal(r[0:50], s[100:150]) ||
			!bytes.Equal(r[4066:], s[300:330]) || !bytes.Equal(r[1050:4050], s[1000:4000]) {
			t.Error("data landed at the wrong offsets")
		}
		if !bytes.Equal(r[50:1000], make([]byte, 950)) || !bytes.Equal(r[4050:4066], make([]byte, 16)) {
			t.Error("bytes outside the writes changed")
		}
	})
}

func TestControlAndMarker(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		a, b := newPair(t, tr, testSpec(), testSpec())
		post(t, a, control(1, 0xa0), marker(b, 2))
		post(t, a, control(3, 0xb0))
		post(t, a, link.SendWR{Kind: link.SendMarker, Remote: 0, RKey: 0, N: 5}) // unsignaled: not checked below
		cs := waitFor(t, b, 2)
		wantKinds(t, "b", cs, "control-arrived", "control-arrived")
		if cs[0].Msg != control(0, 0xa0).Msg || cs[1].Msg != control(0, 0xb0).Msg {
			t.Errorf("messages %x and %x", cs[0].Msg, cs[1].Msg)
		}
		// The unsignaled marker with a bad address fails both ends after
		// the rest.
		wantKinds(t, "a", waitFor(t, a, 4), "send-done 1", "send-done 2", "send-done 3", "failed")
		wantKinds(t, "b", waitFor(t, b, 1), "failed")
		if got := b.recvPostedNow(); got != 2 {
			t.Errorf("b has %d receives posted, want 2 (markers consume none)", got)
		}
	})
}

// Order holds across kinds: data, control and markers land in post order.
func TestOrderAcrossKinds(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		sa, sb := testSpec(), testSpec()
		sa.sendDepth, sa.controlDepth, sb.recvDepth = 64, 64, 64
		a, b := newPair(t, tr, sa, sb)
		fill(a.SendRing(), 3)
		var wrs []link.SendWR
		var want []string
		for i := range 60 {
			switch i % 3 {
			case 0:
				wrs = append(wrs, data(b, uint32(i), uint32(i+1), uint32(i*10), i%2 == 0, uint64(i)))
				want = append(want, fmt.Sprintf("data-arrived %d", i+1))
			case 1:
				wrs = append(wrs, control(uint64(i), byte(i)))
				want = append(want, "control-arrived")
			case 2:
				wrs = append(wrs, marker(b, uint64(i)))
			}
		}
		post(t, a, wrs[:30]...)
		post(t, a, wrs[30:]...)
		cs := waitFor(t, b, len(want))
		wantKinds(t, "b", cs, want...)
		for i, c := range cs {
			if c.Kind == link.ControlArrived && c.Msg != control(0, byte(i/2*3+1)).Msg {
				t.Errorf("control message %d: %x", i, c.Msg)
			}
		}
		var done []string
		for _, wr := range wrs {
			if wr.Signaled {
				done = append(done, fmt.Sprintf("send-done %d", wr.ID))
			}
		}
		wantKinds(t, "a", waitFor(t, a, len(done)), done...)
	})
}

func TestSignaledOnly(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		a, b := newPair(t, tr, testSpec(), testSpec())
		post(t, a, data(b, 0, 1, 0, false, 1), marker(b, 2), data(b, 0, 1, 0, false, 3), data(b, 0, 1, 0, true, 4))
		m := marker(b, 5)
		m.Signaled = false
		post(t, a, m)
		waitFor(t, b, 3)
		wantKinds(t, "a", waitFor(t, a, 2), "send-done 2", "send-done 4")
		// The last marker landed too: a control message after it completes,
		// and nothing comes for the marker.
		post(t, a, control(6, 0))
		wantKinds(t, "a", waitFor(t, a, 1), "send-done 6")
	})
}

func TestMisuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, a, b *Link) error
	}{
		{"send depth", func(t *testing.T, a, b *Link) error {
			var wrs []link.SendWR
			for range 9 {
				wrs = append(wrs, marker(b, 1))
			}
			return a.PostSend(wrs)
		}},
		{"send depth across posts", func(t *testing.T, a, b *Link) error {
			for range 8 {
				if err := a.PostSend([]link.SendWR{marker(b, 1)}); err != nil {
					return fmt.Errorf("below the depth: %v", err)
				}
			}
			return a.PostSend([]link.SendWR{marker(b, 1)})
		}},
		{"control depth", func(t *testing.T, a, b *Link) error {
			return a.PostSend([]link.SendWR{control(1, 0), control(2, 0), control(3, 0)})
		}},
		{"unsignaled control", func(t *testing.T, a, b *Link) error {
			wr := control(1, 0)
			wr.Signaled = false
			return a.PostSend([]link.SendWR{wr})
		}},
		{"data past the send ring", func(t *testing.T, a, b *Link) error {
			return a.PostSend([]link.SendWR{data(b, 4000, 97, 0, true, 1)})
		}},
		{"data offset overflow", func(t *testing.T, a, b *Link) error {
			return a.PostSend([]link.SendWR{data(b, 1<<32-1, 2, 0, true, 1)})
		}},
		{"kind", func(t *testing.T, a, b *Link) error {
			return a.PostSend([]link.SendWR{{Kind: 0, Signaled: true}})
		}},
		{"receives beyond the depth", func(t *testing.T, a, b *Link) error {
			return a.PostRecv(1)
		}},
		{"negative receives", func(t *testing.T, a, b *Link) error {
			return a.PostRecv(-1)
		}},
		{"receives beyond the depth after use", func(t *testing.T, a, b *Link) error {
			post(t, b, data(a, 0, 1, 0, true, 1))
			waitFor(t, a, 1)
			if err := a.PostRecv(1); err != nil {
				return fmt.Errorf("below the depth: %v", err)
			}
			return a.PostRecv(1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newPair(t, "tcp", testSpec(), testSpec())
			if err := tc.do(t, a, b); !errors.Is(err, errMisuse) {
				t.Fatalf("got %v, want a misuse error", err)
			}
			// A rejected PostSend queued none of its requests.
			if seq := a.seqNow(); seq != 0 && seq != 8 {
				t.Errorf("%d requests queued after the error", seq)
			}
		})
	}
}

// A request stays outstanding until its own SendDone, or a later signaled
// one's, is taken by Poll: not when it lands.
func TestOutstanding(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		sa, sb := testSpec(), testSpec()
		sa.sendDepth, sb.recvDepth = 4, 16
		a, b := newPair(t, tr, sa, sb)
		post(t, a, data(b, 0, 1, 0, false, 1), marker(b, 2), data(b, 0, 1, 0, false, 3), marker(b, 4))
		waitFor(t, b, 2)
		if err := a.PostSend([]link.SendWR{marker(b, 5)}); !errors.Is(err, errMisuse) {
			t.Fatalf("fifth request with 4 landed but not taken: %v, want a misuse error", err)
		}
		wantKinds(t, "a", waitFor(t, a, 1), "send-done 2")
		post(t, a, marker(b, 5), marker(b, 6)) // the first two retired
		if err := a.PostSend([]link.SendWR{marker(b, 7)}); !errors.Is(err, errMisuse) {
			t.Fatalf("fifth request: %v, want a misuse error", err)
		}
		wantKinds(t, "a", waitFor(t, a, 3), "send-done 4", "send-done 5", "send-done 6")
		post(t, a, marker(b, 7), marker(b, 8), marker(b, 9), marker(b, 10))

		// Control requests: ControlDepth 2, retired by their own SendDone or
		// a later one's.
		wantKinds(t, "a", waitFor(t, a, 4), "send-done 7", "send-done 8", "send-done 9", "send-done 10")
		post(t, a, control(11, 0), control(12, 0))
		if err := a.PostSend([]link.SendWR{control(13, 0)}); !errors.Is(err, errMisuse) {
			t.Fatalf("third control: %v, want a misuse error", err)
		}
		waitFor(t, a, 2)
		post(t, a, control(13, 0), marker(b, 14))
		waitFor(t, a, 2)
		post(t, a, control(15, 0))
	})
}

// Receiver not ready: messages beyond the receives the peer has posted wait,
// unacknowledged, until it posts more; then they land in order. A send
// completes only once its message landed.
func TestReceiverNotReady(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		sb := testSpec()
		sb.recvDepth = 2
		a, b := newPair(t, tr, testSpec(), sb)
		fill(a.SendRing(), 9)
		for i := range 6 {
			post(t, a, data(b, uint32(i*100), 100, uint32(i*100), true, uint64(i+1)))
		}
		wantKinds(t, "b", waitFor(t, b, 2), "data-arrived 100", "data-arrived 100")
		wantKinds(t, "a", waitFor(t, a, 2), "send-done 1", "send-done 2")
		// b's link acknowledged the two that landed before it stopped for a
		// receive; a control message from b, written after that Ack, arrives
		// at a with no completion for the messages that found no receive.
		post(t, b, control(100, 0))
		wantKinds(t, "a", waitFor(t, a, 1), "control-arrived")
		if cs := pollAll(t, a); len(cs) != 0 {
			t.Fatalf("a got %q while b had no receive posted", kinds(cs))
		}
		// b's control completes when a's Ack reaches b. Over TCP that Ack
		// queues behind the data that found no receive, so it may come at
		// any point until the data is taken: set it apart from the arrivals.
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
		if cs := bArrivals(pollAll(t, b)); len(cs) != 0 {
			t.Fatalf("b got %q with no receive posted", kinds(cs))
		}
		for i := 2; i < 6; i += 2 {
			if err := b.PostRecv(2); err != nil {
				t.Fatal(err)
			}
			var got []link.Completion
			for len(got) < 2 {
				got = append(got, bArrivals(waitFor(t, b, 1))...)
			}
			wantKinds(t, "b", got, "data-arrived 100", "data-arrived 100")
			wantKinds(t, "a", waitFor(t, a, 2), fmt.Sprintf("send-done %d", i+1), fmt.Sprintf("send-done %d", i+2))
		}
		if !controlDone {
			wantKinds(t, "b", waitFor(t, b, 1), "send-done 100")
		}
		if !bytes.Equal(b.RecvRing()[:600], a.SendRing()[:600]) {
			t.Error("bytes differ")
		}
	})
}

func TestRemoteAccessError(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  func(b *Link) link.SendWR
	}{
		{"wrong key", func(b *Link) link.SendWR { wr := data(b, 0, 10, 0, true, 2); wr.RKey++; return wr }},
		{"past the ring", func(b *Link) link.SendWR { return data(b, 0, 10, 4090, true, 2) }},
		{"far past the ring", func(b *Link) link.SendWR { return data(b, 0, 10, 1<<31, true, 2) }},
		{"offset as address", func(b *Link) link.SendWR { wr := data(b, 0, 10, 0, true, 2); wr.Remote = 100; return wr }},
		{"marker with the wrong key", func(b *Link) link.SendWR { wr := marker(b, 2); wr.RKey++; return wr }},
		{"marker past the ring", func(b *Link) link.SendWR { wr := marker(b, 2); wr.Remote += 4097; return wr }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, tr string) {
				a, b := newPair(t, tr, testSpec(), testSpec())
				post(t, a, data(b, 0, 10, 0, true, 1), tc.bad(b), data(b, 0, 10, 0, true, 3))
				ca := waitFor(t, a, 2)
				wantKinds(t, "a", ca, "send-done 1", "failed")
				cb := waitFor(t, b, 2)
				wantKinds(t, "b", cb, "data-arrived 10", "failed")
				for who, c := range map[string]link.Completion{"a": ca[1], "b": cb[1]} {
					if !errors.Is(c.Err, link.ErrRemoteAccess) || errors.Is(c.Err, link.ErrDown) {
						t.Errorf("%s's error: %v, want a remote access error", who, c.Err)
					}
				}
				if cs := append(pollAll(t, a), pollAll(t, b)...); len(cs) != 0 {
					t.Errorf("completions after the failure: %q", kinds(cs))
				}
			})
		})
	}
}

// Disconnect from either end: what the ends had received comes first, then
// Disconnected; requests not written are flushed; requests after it are
// flushed too.
func TestDisconnect(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		for _, who := range []string{"initiator", "peer"} {
			t.Run(who, func(t *testing.T) {
				a, b := newPair(t, tr, testSpec(), testSpec())
				// b sent a something that a has not polled yet.
				post(t, b, data(a, 0, 7, 0, true, 1))
				wantKinds(t, "b", waitFor(t, b, 1), "send-done 1")
				// a sent b something that landed.
				post(t, a, data(b, 0, 5, 0, true, 1))
				wantKinds(t, "a", waitFor(t, a, 2), "data-arrived 7", "send-done 1")
				post(t, b, data(a, 0, 8, 0, true, 2))
				wantKinds(t, "b", waitFor(t, b, 2), "data-arrived 5", "send-done 2")
				// a has 8 bytes from b to poll; b's request 3 and a's
				// request 2 may or may not land.
				post(t, b, data(a, 0, 9, 0, true, 3))
				post(t, a, data(b, 0, 6, 0, true, 2))
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
					post(t, x, marker(y, 9), marker(y, 9), marker(y, 9), marker(y, 9))
				}
				ca, cb := waitEnd(t, a), waitEnd(t, b)
				// a had 8 bytes from b to poll: they come first. What was
				// in flight may or may not have landed or completed;
				// Disconnected is last.
				checkEnd(t, "a", ca, []string{"data-arrived 8"}, "data-arrived 9", "send-done 2")
				checkEnd(t, "b", cb, nil, "data-arrived 6", "send-done 3")
				// Nothing more is posted or delivered; calls still work.
				post(t, x, marker(y, 10))
				if err := y.Disconnect(); err != nil {
					t.Fatalf("Disconnect after the peer's: %v", err)
				}
				if err := a.Wait(); err != nil {
					t.Fatalf("Wait on a link that is down: %v", err)
				}
			})
		}
	})
}

// The initiator of a Disconnect reports Disconnected after what had arrived,
// even if it arrived unpolled.
func TestDisconnectAfterArrived(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		a, b := newPair(t, tr, testSpec(), testSpec())
		if err := a.Arm(); err != nil {
			t.Fatal(err)
		}
		post(t, b, control(1, 0))
		guard := time.AfterFunc(hangGuard, a.Wake)
		defer guard.Stop()
		if err := a.Wait(); err != nil {
			t.Fatal(err)
		}
		if err := a.Disconnect(); err != nil {
			t.Fatal(err)
		}
		wantKinds(t, "a", pollAll(t, a), "control-arrived", "disconnected")
		wantKinds(t, "b", waitEnd(t, b), "send-done 1", "disconnected")
	})
}

// A peer whose link is closed without Disconnect (its process died and its
// kernel closed the socket) is gone: Disconnected, not a path failure,
// after what it sent before.
func TestPeerClosedAbruptly(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		a, b := newPair(t, tr, testSpec(), testSpec())
		post(t, b, data(a, 0, 100, 0, true, 1), control(2, 0))
		wantKinds(t, "b", waitFor(t, b, 2), "send-done 1", "send-done 2")
		post(t, a, data(b, 0, 100, 0, true, 1)) // may or may not land
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		checkEnd(t, "a", waitEnd(t, a), []string{"data-arrived 100", "control-arrived"}, "send-done 1")
	})
}

// A socket reset with data unread (SO_LINGER 0, as a process dies with data
// in its socket) is the peer gone too; what arrived before the reset lands.
func TestPeerReset(t *testing.T) {
	ca, cb := connPair(t, "tcp")
	checkGoroutines(t)
	a, err := newLink(ca, testSpec().config(), 42)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// The raw peer writes a data frame and a control frame, then resets.
	var frames []byte
	frames = append(frames, frameData)
	frames = be.AppendUint32(frames, 42)
	frames = be.AppendUint64(frames, RingAddr+10)
	frames = be.AppendUint32(frames, 3)
	frames = append(frames, "abc"...)
	frames = append(frames, frameControl)
	frames = append(frames, make([]byte, 32)...)
	if _, err := cb.Write(frames); err != nil {
		t.Fatal(err)
	}
	// Wait for the Ack of both frames, so the reset comes after they landed.
	ack := make([]byte, 9)
	for got := uint64(0); got < 2; got = be.Uint64(ack[1:]) {
		if _, err := io.ReadFull(cb, ack); err != nil || ack[0] != frameAck {
			t.Fatalf("reading the ack: %v %x", err, ack)
		}
	}
	post(t, a, control(1, 0)) // unread by the peer: its close resets
	if err := cb.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	cb.Close()
	cs := waitEnd(t, a)
	wantKinds(t, "a", cs, "data-arrived 3", "control-arrived", "disconnected")
	if string(a.RecvRing()[10:13]) != "abc" {
		t.Errorf("ring %q", a.RecvRing()[10:13])
	}
}

// A socket error that is not the peer's end is a path failure: Failed,
// matching link.ErrDown.
func TestPathFailure(t *testing.T) {
	t.Run("read timeout", func(t *testing.T) {
		ca, cb := connPair(t, "tcp")
		a, _ := newLinks(t, ca, cb, testSpec(), testSpec())
		ca.SetReadDeadline(time.Now())
		cs := waitEnd(t, a)
		wantKinds(t, "a", cs, "failed")
		if err := cs[0].Err; !errors.Is(err, link.ErrDown) {
			t.Errorf("error %v, want link.ErrDown", err)
		}
	})
	t.Run("write error", func(t *testing.T) {
		ca, cb := connPair(t, "tcp")
		fc := &faultConn{Conn: ca}
		a, b := newLinks(t, fc, cb, testSpec(), testSpec())
		post(t, a, control(1, 0))
		wantKinds(t, "a", waitFor(t, a, 1), "send-done 1")
		fc.fail(errHostUnreachable)
		post(t, a, control(2, 0))
		cs := waitEnd(t, a)
		wantKinds(t, "a", cs, "failed")
		if err := cs[0].Err; !errors.Is(err, link.ErrDown) || !errors.Is(err, errHostUnreachable) {
			t.Errorf("error %v, want link.ErrDown and EHOSTUNREACH", err)
		}
		wantKinds(t, "b", waitFor(t, b, 1), "control-arrived")
	})
}

// Wait, Arm and Wake: a Wake before Wait makes the next Wait return
// ErrWoken; a completion after Arm ends a Wait; Close ends a Wait.
func TestWaitWake(t *testing.T) {
	a, b := newPair(t, "tcp", testSpec(), testSpec())
	a.Wake()
	if err := a.Wait(); err != link.ErrWoken {
		t.Fatalf("Wait after Wake: %v", err)
	}
	a.Arm()
	done := make(chan error, 1)
	go func() { done <- a.Wait() }()
	post(t, b, control(1, 0))
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

func TestUseAfterClose(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		a, b := newPair(t, tr, testSpec(), testSpec())
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		for name, err := range map[string]error{
			"PostSend":   a.PostSend([]link.SendWR{marker(b, 1)}),
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
		wantKinds(t, "b", waitEnd(t, b), "disconnected")
	})
}

// A deadline the handshake left on the socket does not end the link.
func TestNewClearsDeadlines(t *testing.T) {
	ca, cb := connPair(t, "tcp")
	ca.SetDeadline(time.Now().Add(-time.Second))
	a, b := newLinks(t, ca, cb, testSpec(), testSpec())
	post(t, b, control(1, 0))
	wantKinds(t, "a", waitFor(t, a, 1), "control-arrived")
	post(t, a, control(1, 0))
	wantKinds(t, "a", waitFor(t, a, 1), "send-done 1")
}
