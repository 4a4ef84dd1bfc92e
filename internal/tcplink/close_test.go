package tcplink

import (
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// TestCloseReleasesRings: once Close returns, the link touches neither ring:
// the caller may reuse them at once (for the session's next link). Both ends
// stream into each other when one closes, and the test then writes all of
// the closed end's rings; the race detector reports an access by the
// link's goroutines that Close did not wait for (over TCP it sees the
// reads into the receive ring and the copies of small payloads; over
// net.Pipe every copy).
func TestCloseReleasesRings(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tr string) {
		for i := range 20 {
			sp := spec{sendRing: 64 << 10, recvRing: 64 << 10, sendDepth: 16, recvDepth: 8, controlDepth: 2}
			a, b := newPair(t, tr, sp, sp)
			peerDone := make(chan struct{})
			go func() {
				defer close(peerDone)
				blast(t, b, a, -1)
			}()
			blast(t, a, b, 50+i*10)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			for _, r := range [][]byte{a.SendRing(), a.RecvRing()} {
				for j := range r {
					r[j] = byte(j)
				}
			}
			<-peerDone
		}
	})
}

// blast sends data requests of mixed sizes from l to peer as fast as the
// link takes them, with no flow control (the bytes are not checked), and
// reposts receives, until it has taken completions completions (-1: until
// the link ends).
func blast(t *testing.T, l, peer *Link, completions int) {
	guard := time.AfterFunc(hangGuard, l.Wake)
	defer guard.Stop()
	addr, key := peer.RecvRingKey()
	cs := make([]link.Completion, 16)
	outstanding, id := 0, uint64(0)
	wrs := make([]link.SendWR, 0, l.Caps().SendDepth)
	for taken := 0; completions < 0 || taken < completions; {
		wrs = wrs[:0]
		for outstanding+len(wrs) < l.Caps().SendDepth {
			id++
			n := uint32(100)
			if id%2 == 0 {
				n = 16 << 10
			}
			off := uint32(id*4096) % (64 << 10)
			n = min(n, 64<<10-off)
			wrs = append(wrs, link.SendWR{Kind: link.SendData, Signaled: true, ID: id, Off: off, N: n, Remote: addr + uint64(off), RKey: key})
		}
		if err := l.PostSend(wrs); err != nil {
			t.Errorf("PostSend: %v", err)
			return
		}
		outstanding += len(wrs)
		n, err := l.Poll(cs)
		if err != nil {
			t.Errorf("Poll: %v", err)
			return
		}
		if n == 0 {
			l.Arm()
			if n, _ = l.Poll(cs); n == 0 {
				if err := l.Wait(); err != nil {
					t.Errorf("Wait: %v", err)
					return
				}
				continue
			}
		}
		reposts := 0
		for _, c := range cs[:n] {
			taken++
			switch c.Kind {
			case link.SendDone:
				outstanding--
			case link.DataArrived:
				reposts++
			case link.Disconnected:
				if completions < 0 {
					return
				}
				t.Errorf("disconnected")
				return
			default:
				t.Errorf("%v: %v", c.Kind, c.Err)
				return
			}
		}
		if err := l.PostRecv(reposts); err != nil {
			t.Errorf("PostRecv: %v", err)
			return
		}
	}
}

// TestReleaseOnce: Config.Release tells the rings' owner when the link is
// done with them: once, at the first Close (after the link's goroutines
// ended), or by a New that fails.
func TestReleaseOnce(t *testing.T) {
	var released int
	ca, _ := connPair(t, "pipe")
	if _, err := New(ca, Config{SendDepth: -1, Release: func() { released++ }}); err == nil || released != 1 {
		t.Fatalf("a failed New: err %v, Release called %d times, want an error and 1", err, released)
	}
	released = 0
	ca, _ = connPair(t, "pipe")
	l, err := New(ca, Config{SendRing: make([]byte, 4096), RecvRing: make([]byte, 4096), SendDepth: 4, RecvDepth: 4, ControlDepth: 2,
		Release: func() { released++ }})
	if err != nil {
		t.Fatal(err)
	}
	if released != 0 {
		t.Fatalf("Release called %d times before Close", released)
	}
	l.Close()
	l.Close()
	if released != 1 {
		t.Fatalf("after two Closes, Release called %d times, want 1", released)
	}
}
