package tcplink

import (
	"errors"
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
