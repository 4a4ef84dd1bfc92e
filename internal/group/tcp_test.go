package group_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/tcplink"
)

// tcpPair is a group's TCP link, both ends: a tcplink carrier over an
// in-memory socket, sized as baseConfig's pipes.
func tcpPair(t testing.TB) (*tcplink.Link, *tcplink.Link) {
	t.Helper()
	ca, cb := net.Pipe()
	pc := baseConfig()
	cfg := tcplink.Config{Carrier: true, SendDepth: pc.SendDepth, RecvDepth: pc.RecvDepth, ControlDepth: pc.ControlDepth}
	a, err := tcplink.New(ca, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tcplink.New(cb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// TestMoveToTCPAndBack: a TCP link is a group's last path. No stream
// opens on it; when the only other link fails, every stream moves to it,
// with the rings it has, and its bytes arrive; when a link that is not
// TCP is added, every stream moves there and the dialer retires the TCP
// link.
func TestMoveToTCPAndBack(t *testing.T) {
	linktest.CheckGoroutines(t)
	a, b, pa, _ := muxPair(t, moveConfig(true), moveConfig(false), baseConfig())
	ta, tb := tcpPair(t)
	if err := b.AddLink(tb); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(ta); err != nil {
		t.Fatal(err)
	}
	xs, ys, closeAll := openPairs(t, a, b, 4)
	defer closeAll()
	streamsOn := func(who string, m *group.Mux, want map[string]int) {
		t.Helper()
		got := map[string]int{}
		for _, l := range m.Links() {
			got[l.Base.Caps().Transport] += l.Streams
		}
		for k, n := range want {
			if got[k] != n {
				t.Errorf("%s: %d streams on %s links, want %d (links %+v)", who, got[k], k, n, m.Links())
			}
		}
	}
	streamsOn("dialer", a, map[string]int{"memory": 4, "tcp": 0})
	for i := range xs {
		ping(t, xs[i], ys[i], []byte("over the first link"), 1)
	}

	pa.Cut(errors.New("test: port down"))
	for i := range xs {
		for who, s := range map[string]*group.Stream{"dialer": xs[i], "listener": ys[i]} {
			linktest.WantKinds(t, who, takeUntil(t, s, link.Resumed), "failed", "resumed")
		}
		announce(t, ys[i], xs[i])
		announce(t, xs[i], ys[i])
	}
	for i := range xs {
		ping(t, xs[i], ys[i], []byte("over TCP"), 10)
	}
	streamsOn("dialer", a, map[string]int{"tcp": 4})
	streamsOn("listener", b, map[string]int{"tcp": 4})
	if _, err := a.Open(context.Background(), 7); !errors.Is(err, group.ErrLimit) {
		t.Errorf("Open with only the TCP link: %v, want group.ErrLimit", err)
	}

	qa, qb := linktest.NewPipes(t, baseConfig(), baseConfig())
	if err := b.AddLink(qb); err != nil {
		t.Fatal(err)
	}
	if err := a.AddLink(qa); err != nil {
		t.Fatal(err)
	}
	for i := range xs {
		linktest.WantKinds(t, "dialer", takeUntil(t, xs[i], link.Resumed), "failed", "resumed")
		linktest.WantKinds(t, "listener", takeUntil(t, ys[i], link.Resumed), "failed", "resumed")
		announce(t, ys[i], xs[i])
		announce(t, xs[i], ys[i])
	}
	for i := range xs {
		ping(t, xs[i], ys[i], []byte("back over a link that is not TCP"), 20)
	}
	for who, m := range map[string]*group.Mux{"dialer": a, "listener": b} {
		waitUntil(t, who+"'s TCP link retired", func() bool {
			ls := m.Links()
			return len(ls) == 1 && ls[0].Base.Caps().Transport == "memory" && ls[0].Streams == 4
		})
		// One link failed (the cut); the TCP link's retirement is no failure.
		if st := m.Stats(); st.LinksDown != 1 || st.Moved != 8 || st.Streams != 4 {
			t.Errorf("%s: %+v, want 1 link down, 8 moves, 4 streams", who, st)
		}
	}
	// The streams only passed through the TCP link: once they left, it
	// holds none of their rings and is closed, while they live on.
	for who, l := range map[string]*tcplink.Link{"dialer": ta, "listener": tb} {
		waitUntil(t, who+"'s TCP link closed", func() bool {
			_, err := l.Poll(make([]link.Completion, 1))
			return err != nil
		})
	}
	for i := range xs {
		ping(t, xs[i], ys[i], []byte("after the TCP link closed"), 30)
	}
}

// waitUntil polls cond until it holds, up to linktest.HangGuard.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(linktest.HangGuard); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, linktest.HangGuard)
		}
	}
}
