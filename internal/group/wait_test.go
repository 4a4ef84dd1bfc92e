package group_test

import (
	"errors"
	"fmt"
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
