package group_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// baseConfig is a base pipe big enough for many streams: receive-not-ready
// never happens on it (the streams' credit sees to that), so RNRRetry 0
// makes any overrun fail loudly.
func baseConfig() link.PipeConfig {
	return link.PipeConfig{SendRing: 64, RecvRing: 64, SendDepth: 64, RecvDepth: 512, ControlDepth: 16,
		RecvCredit: true, RecvGrant: true}
}

// muxPair makes two groups over a pipe, a opening streams and b accepting
// them, closed when the test ends.
func muxPair(t testing.TB, ca, cb group.Config, pc link.PipeConfig) (*group.Mux, *group.Mux, *link.Pipe, *link.Pipe) {
	t.Helper()
	pa, pb := linktest.NewPipes(t, pc, pc)
	a, err := group.New(pa, ca)
	if err != nil {
		t.Fatal(err)
	}
	b, err := group.New(pb, cb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		b.Close()
	})
	return a, b, pa, pb
}

func specConfig(s linktest.Spec) group.Config {
	c := group.DefaultConfig()
	c.SendRing, c.RecvRing = s.SendRing, s.RecvRing
	c.SendDepth, c.ControlDepth = s.SendDepth, s.ControlDepth
	c.FirstGrant, c.MaxGrant = s.RecvDepth, s.RecvDepth
	return c
}

// openPair opens a stream of a's that b accepts.
func openPair(t testing.TB, a, b *group.Mux) (*group.Stream, *group.Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
	defer cancel()
	type res struct {
		s   *group.Stream
		err error
	}
	acc := make(chan res, 1)
	go func() {
		s, err := b.Accept(ctx)
		acc <- res{s, err}
	}()
	sa, err := a.Open(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	return sa, r.s
}

// openPairs opens n streams of a's that b accepts, and returns them with
// a func that closes them all, for the test to defer.
func openPairs(t testing.TB, a, b *group.Mux, n int) (xs, ys []*group.Stream, closeAll func()) {
	t.Helper()
	for range n {
		x, y := openPair(t, a, b)
		xs, ys = append(xs, x), append(ys, y)
	}
	return xs, ys, func() {
		for i := range xs {
			xs[i].Close()
			ys[i].Close()
		}
	}
}

// TestConformance: a group's streams are links like any other.
func TestConformance(t *testing.T) {
	linktest.Run(t, func(t *testing.T, sa, sb linktest.Spec) (link.Link, link.Link) {
		a, b, _, _ := muxPair(t, specConfig(sa), specConfig(sb), baseConfig())
		x, y := openPair(t, a, b)
		t.Cleanup(func() {
			x.Close()
			y.Close()
		})
		return x, y
	})
}

var _ = time.Second

// TestOpenPollsForItsAnswer: opens one after another with OpenPoll take
// their answers while they poll the dialer's base link, which rests
// between them (the opens polled it, so the service let it rest): no
// completion event an open. An Open that sleeps in the link's Wait at
// once (OpenPoll 0) arms it, and its answer raises an event, as the
// control case shows. An open slow enough for the poll to give up may
// raise some; the bound allows for them.
func TestOpenPollsForItsAnswer(t *testing.T) {
	for _, poll := range []time.Duration{0, 2 * time.Millisecond} {
		t.Run(fmt.Sprintf("OpenPoll=%v", poll), func(t *testing.T) {
			ca := group.DefaultConfig()
			ca.OpenPoll = poll
			a, b, pa, _ := muxPair(t, ca, group.DefaultConfig(), baseConfig())
			ctx, cancel := context.WithTimeout(context.Background(), linktest.HangGuard)
			defer cancel()
			accepted := make(chan *group.Stream)
			go func() {
				for {
					s, err := b.Accept(ctx)
					if err != nil {
						close(accepted)
						return
					}
					accepted <- s
				}
			}()
			open := func() time.Duration {
				start := time.Now()
				x, err := a.Open(ctx, 7)
				if err != nil {
					t.Fatal(err)
				}
				took := time.Since(start)
				y, ok := <-accepted
				if !ok {
					t.Fatal("Accept ended")
				}
				x.Close()
				y.Close()
				return took
			}
			const warm, opens = 10, 200
			for range warm {
				open()
			}
			before, slow := pa.Stats().Events, 0
			for range opens {
				if open() > max(poll, time.Millisecond) {
					slow++ // its poll may have given up
				}
			}
			n := pa.Stats().Events - before
			t.Logf("%d events at the dialer in %d opens (%d slow)", n, opens, slow)
			switch {
			case poll > 0 && n > opens/4+2*uint64(slow):
				t.Errorf("%d completion events over the dialer's link in %d opens (%d over %v): its opens slept for their answers", n, opens, slow, poll)
			case poll == 0 && n < opens/2:
				t.Errorf("%d completion events over the dialer's link in %d opens that slept for their answers: the test cannot tell", n, opens)
			}
		})
	}
}
