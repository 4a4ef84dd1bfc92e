package rdmanet

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
	"github.com/rdmanet/sdk/internal/wire"
)

// groupFeatures are what a group's streams speak: rings with half-close,
// and credit for every message, granted from the group's pool.
const groupFeatures = wire.FeatureRing | wire.FeatureShutdown | wire.FeatureRecvCredit | wire.FeatureRecvGrant

// groupBase is a base pipe for streams streams: receives for each one's
// first grant and room to grant more, and receiver-not-ready fatal, so
// that an overrun of the credit fails loudly.
func groupBase(streams int) link.PipeConfig {
	return link.PipeConfig{SendRing: 64, RecvRing: 64, SendDepth: 256, ControlDepth: 32,
		RecvDepth: 64 + 16*streams, RecvCredit: true, RecvGrant: true}
}

// groupMuxes makes two groups over a pipe, closed when the test ends.
func groupMuxes(t testing.TB, gc group.Config, pc link.PipeConfig) (a, b *group.Mux) {
	t.Helper()
	pa, pb := linktest.NewPipes(t, pc, pc)
	a, err := group.New(pa, gc)
	if err != nil {
		t.Fatal(err)
	}
	if b, err = group.New(pb, gc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b
}

// groupStreamConfig is a group's stream sizes for connections with cfg.
func groupStreamConfig(cfg Config) group.Config {
	gc := group.DefaultConfig()
	first := cfg.firstRings()
	gc.SendRing, gc.RecvRing = first.SendBuffer, first.RecvBuffer
	return gc
}

// streamConn makes a Conn over a group's stream.
func streamConn(t testing.TB, s *group.Stream, cfg Config, server bool) *Conn {
	t.Helper()
	size, grant := s.PeerRing()
	hello := wire.Hello{Version: wire.HelloVersion, Features: groupFeatures, RecvDepth: uint16(grant), RingSize: size}
	c, err := newLinkConn(s, cfg, server, groupFeatures, hello)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// groupConnPair opens a stream of a's that b accepts and makes a Conn at
// each end.
func groupConnPair(t testing.TB, cfg Config, a, b *group.Mux) (client, server *Conn) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	accepted := make(chan *group.Stream, 1)
	go func() {
		s, err := b.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		accepted <- s
	}()
	sa, err := a.Open(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	sb := <-accepted
	if sb == nil {
		t.FailNow()
	}
	return streamConn(t, sa, cfg, false), streamConn(t, sb, cfg, true)
}

// TestGroupNetConn: a Conn over a group's stream keeps net.Conn's whole
// contract, with other streams of the group open beside it.
func TestGroupNetConn(t *testing.T) {
	goroutineCheck(t)
	cfg, _ := Config{}.withDefaults()
	a, b := groupMuxes(t, groupStreamConfig(cfg), groupBase(64))
	// Streams that stay open, idle, beside those the suite makes.
	for range 4 {
		x, y := groupConnPair(t, Config{}, a, b)
		t.Cleanup(func() { closeAndWait(t, x); closeAndWait(t, y) })
	}
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		x, y := groupConnPair(t, Config{}, a, b)
		return x, y, func() { x.Close(); y.Close() }, nil
	})
	// The suite closes without waiting: its streams go as the Conns
	// release their links.
	for _, m := range []*group.Mux{a, b} {
		deadline := time.Now().Add(2 * lingerTimeout)
		for m.Stats().Streams != 4 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if st := m.Stats(); st.Streams != 4 {
			t.Errorf("%d streams open after the suite, want the 4 idle ones: %+v", st.Streams, st)
		}
	}
}
