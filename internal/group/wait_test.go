package group_test

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/sdk/internal/group"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// TestWaitersOnOneLink: many streams of one base link each sleep in Wait
// (one leads, sleeping in the base link's Wait; the others follow), and
// messages to them in an order of their own wake each the right one, with
// the lead passing from stream to stream.
func TestWaitersOnOneLink(t *testing.T) {
	linktest.CheckGoroutines(t)
	spec := specConfig(linktest.DefaultSpec())
	a, b, _, _ := muxPair(t, spec, spec, baseConfig())
	const n = 20
	xs, ys, closeAll := openPairs(t, a, b, n)
	defer closeAll()
	errs := make(chan error, n)
	for i, y := range ys {
		go func() { errs <- waitControl(y, byte(i)) }()
	}
	for i := n - 1; i >= 0; i-- {
		if i%4 == 0 {
			time.Sleep(time.Millisecond) // some waiters have returned, others still sleep
		}
		linktest.Post(t, xs[i], linktest.Control(1, byte(i)))
	}
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(linktest.HangGuard):
			t.Fatal("a stream's Wait did not return for its message")
		}
	}
}

// waitControl waits, as an engine does (arm, poll once more, wait), for
// one control message on s, which must start with b.
func waitControl(s *group.Stream, b byte) error {
	cs := make([]link.Completion, 1)
	for {
		k, err := s.Poll(cs)
		if err == nil && k == 0 {
			if err = s.Arm(); err == nil {
				if k, err = s.Poll(cs); err == nil && k == 0 {
					if err = s.Wait(); errors.Is(err, link.ErrWoken) {
						err = nil
					}
				}
			}
		}
		switch {
		case err != nil:
			return err
		case k == 0:
			continue
		case cs[0].Kind != link.ControlArrived || cs[0].Msg[0] != b:
			return fmt.Errorf("stream %d: got %v (%d), want its control message", b, cs[0].Kind, cs[0].Msg[0])
		}
		return nil
	}
}

// armCounter counts its base link's Arms and Polls.
type armCounter struct {
	link.Carrier
	arms, polls atomic.Int64
}

func (c *armCounter) Arm() error { c.arms.Add(1); return c.Carrier.Arm() }

func (c *armCounter) Poll(cs []link.Completion) (int, error) {
	c.polls.Add(1)
	return c.Carrier.Poll(cs)
}

// TestPollingStreamLeavesBaseUnarmed: while a stream polls its base link
// (a Read that spins, connfd's adaptive polling), the link is not armed
// again at each completion, which woke the link's service (or a yielding
// leader) for each message the poller took anyway; the stream's Arm, when
// it stops polling, arms it again; and a poller that stops with no Arm
// (its connection closed) leaves nothing untold: the service looks again.
func TestPollingStreamLeavesBaseUnarmed(t *testing.T) {
	linktest.CheckGoroutines(t)
	const n = 100
	spec := specConfig(linktest.DefaultSpec())
	spec.FirstGrant, spec.MaxGrant = n+8, n+8 // no engine here to give credit as it goes
	pa, pb := linktest.NewPipes(t, baseConfig(), baseConfig())
	counted := &armCounter{Carrier: pb}
	a, err := group.New(pa, spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := group.New(counted, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	x, y := openPair(t, a, b)
	defer x.Close()
	defer y.Close()

	cs := make([]link.Completion, 8)
	// until polls s until a completion of kind k, as a Read that spins.
	until := func(s *group.Stream, k link.CompletionKind) {
		t.Helper()
		for end := time.Now().Add(linktest.HangGuard); ; runtime.Gosched() {
			n, err := s.Poll(cs)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(cs[:n], func(c link.Completion) bool { return c.Kind == k }) {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("no %v came (%d polls of the base)", k, counted.polls.Load())
			}
		}
	}
	before := counted.arms.Load()
	for i := range n {
		linktest.Post(t, x, linktest.Control(1, byte(i)))
		until(y, link.ControlArrived)
		if err := y.PostRecv(1); err != nil {
			t.Fatal(err)
		}
		until(x, link.SendDone)
		time.Sleep(200 * time.Microsecond) // time for the service, if kicked, to arm the link
	}
	if arms := counted.arms.Load() - before; arms > n/10 {
		t.Errorf("the base link was armed %d times for %d messages a stream polled for", arms, n)
	}

	// The poller stops, to sleep: its Arm arms the link, and the next
	// message wakes it.
	waited := make(chan error, 1)
	go func() { waited <- waitControl(y, 200) }()
	linktest.Post(t, x, linktest.Control(1, 200))
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(linktest.HangGuard):
		t.Fatal("a stream that stopped polling to sleep was not woken")
	}
	y.PostRecv(1)
	until(x, link.SendDone)

	// The poller stops with no Arm, after the service took a message it
	// polled for: what comes next for another stream is told.
	x2, z := openPair(t, a, b)
	defer x2.Close()
	defer z.Close()
	told := make(chan struct{}, 1)
	z.SetNotify(func() {
		select {
		case told <- struct{}{}:
		default:
		}
	})
	// z is idle, as connfd leaves it: armed, and polled once more.
	if err := z.Arm(); err != nil {
		t.Fatal(err)
	}
	if k, err := z.Poll(cs); err != nil || k != 0 {
		t.Fatalf("z's Poll: %d, %v", k, err)
	}
	if k, err := y.Poll(cs); err != nil || k != 0 {
		t.Fatalf("y's Poll: %d, %v", k, err)
	}
	polls := counted.polls.Load()
	linktest.Post(t, x, linktest.Control(1, 201))
	for end := time.Now().Add(linktest.HangGuard); counted.polls.Load() == polls; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(end) {
			t.Fatal("nobody took the message to the stream that polled")
		}
	}
	linktest.Post(t, x2, linktest.Control(1, 202))
	select {
	case <-told:
	case <-time.After(linktest.HangGuard):
		t.Fatal("a message to a stream nobody polls was not told, after a poller stopped with no Arm")
	}
	until(z, link.ControlArrived)
	until(y, link.ControlArrived)
}
