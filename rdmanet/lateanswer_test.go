package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/wire"
)

// TestDialMemoryOfABusyPeer: a timeout toward a peer that answers RDMA is
// not remembered and does not say the host may have no RDMA; a late answer
// forgets a timeout remembered before it.
func TestDialMemoryOfABusyPeer(t *testing.T) {
	ForgetFailures()
	t.Cleanup(ForgetFailures)
	dst := netip.MustParseAddrPort("198.18.0.2:7471")
	timeout := context.DeadlineExceeded

	why := attemptFailed(dst, timeout)
	if why.Reason != fallback.ReasonTimeout || why.PeerAnswers || failures.Recall(dst) == nil {
		t.Fatalf("first timeout: %+v, remembered %v; want a remembered timeout (nothing known of the peer)", why, failures.Recall(dst))
	}
	lateAnswer(dst, cm.EventUnreachable) // not an answer
	if failures.Recall(dst) == nil {
		t.Fatal("an UNREACHABLE after the dial forgot the timeout")
	}
	lateAnswer(dst, cm.EventEstablished)
	if got := failures.Recall(dst); got != nil {
		t.Fatalf("a late answer left %v remembered", got)
	}
	why = attemptFailed(dst, timeout)
	if !why.PeerAnswers || failures.Recall(dst) != nil {
		t.Errorf("a timeout toward a peer that answered: %+v, remembered %v; want a busy peer, not remembered", why, failures.Recall(dst))
	}
	if s := why.Error(); !errors.Is(why, fallback.ReasonTimeout) || strings.Contains(s, "may have no RDMA") {
		t.Errorf("its message: %q", s)
	}

	// Silent even for busyAnswerWait: not remembered this time, but the
	// next timeout counts as any other.
	why = attemptFailed(dst, errNoBusyAnswer)
	if !why.PeerAnswers || failures.Recall(dst) != nil || failures.Answers(dst) {
		t.Errorf("no answer in busyAnswerWait: %+v, remembered %v, still answers %v; want a busy peer, not remembered, no longer answering",
			why, failures.Recall(dst), failures.Answers(dst))
	}
	if why := attemptFailed(dst, errNoAnswer); why.PeerAnswers || failures.Recall(dst) == nil {
		t.Errorf("the timeout after that: %+v, remembered %v; want a remembered timeout", why, failures.Recall(dst))
	}

	other := netip.MustParseAddrPort("198.18.0.2:7472")
	lateAnswer(other, cm.EventRejected)
	if !failures.Answers(other) {
		t.Error("a late reject is an answer too")
	}

	refused := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectConsumer}
	third := netip.MustParseAddrPort("198.18.0.3:7471")
	if why := attemptFailed(third, refused); !why.PeerAnswers || failures.Recall(third) != nil {
		t.Errorf("a listener's refusal: %+v, remembered %v; want not remembered", why, failures.Recall(third))
	}
	noListener := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectInvalidServiceID}
	if why := attemptFailed(third, noListener); why.PeerAnswers || failures.Recall(third) == nil {
		t.Errorf("no listener on the port: %+v, remembered %v; want remembered", why, failures.Recall(third))
	}
}

// TestAnswerContext: the wait for an answer ends with errNoAnswer toward a
// peer not known to answer, with errNoBusyAnswer (after the longer wait)
// toward one that answered, and with neither when the dial stops it or the
// caller's context ends.
func TestAnswerContext(t *testing.T) {
	ForgetFailures()
	t.Cleanup(ForgetFailures)
	unknown := netip.MustParseAddrPort("198.18.0.5:7471")
	known := netip.MustParseAddrPort("198.18.0.6:7471")
	failures.Answered(known)
	cause := func(ctx context.Context) error {
		t.Helper()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(hangGuard):
			t.Fatal("the wait never ended")
			return nil
		}
	}
	ctx, stop := answerContext(context.Background(), unknown, time.Millisecond, 2*time.Millisecond)
	if c := cause(ctx); c != errNoAnswer {
		t.Errorf("toward a peer not known to answer: %v, want errNoAnswer", c)
	}
	stop()
	ctx, stop = answerContext(context.Background(), known, time.Millisecond, 2*time.Millisecond)
	if c := cause(ctx); c != errNoBusyAnswer {
		t.Errorf("toward a peer that answered: %v, want errNoBusyAnswer", c)
	}
	stop()
	// A new listener on a host that answered: its silence is a busy host's
	// too. (CI saw TestLabStat's bench fall back to TCP after 1 s, the
	// default RDMATimeout, toward a new listener on a host it had just used.)
	ctx, stop = answerContext(context.Background(), netip.AddrPortFrom(known.Addr(), 7472), time.Millisecond, 2*time.Millisecond)
	if c := cause(ctx); c != errNoBusyAnswer {
		t.Errorf("toward another port of a host that answered: %v, want errNoBusyAnswer", c)
	}
	stop()
	ctx, stop = answerContext(context.Background(), unknown, time.Hour, time.Hour)
	stop()
	if c := cause(ctx); c != context.Canceled {
		t.Errorf("stopped by the dial: %v, want context.Canceled", c)
	}
	parent, cancel := context.WithCancel(context.Background())
	ctx, stop = answerContext(parent, unknown, time.Hour, time.Hour)
	defer stop()
	cancel()
	if c := cause(ctx); c != context.Canceled {
		t.Errorf("the caller's context ended: %v, want context.Canceled", c)
	}
	if !errors.Is(errNoAnswer, context.DeadlineExceeded) || !errors.Is(errNoBusyAnswer, context.DeadlineExceeded) ||
		fallback.Classify(errNoAnswer) != fallback.ReasonTimeout {
		t.Error("the answer's timeouts are not timeouts")
	}
}

func TestFallbackRoom(t *testing.T) {
	if got := fallbackRoom(context.Background(), time.Hour); got != time.Hour {
		t.Errorf("without a deadline: %v, want the whole wait", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	// Half an hour, less the moments since the context was made.
	if got := fallbackRoom(ctx, 2*time.Hour); got > 30*time.Minute || got < 29*time.Minute {
		t.Errorf("with an hour left: %v, want half an hour", got)
	}
	if got := fallbackRoom(ctx, time.Second); got != time.Second {
		t.Errorf("a short wait with an hour left: %v, want it whole", got)
	}
}

// TestLoadedAnswerWait: a dial with the default RDMATimeout whose own
// set-up was slow waits longer for the answer, within busyAnswerWait and
// half the caller's time; one whose set-up was quick waits RDMATimeout, a
// timeout the caller set is kept, and a dial that may not fall back is
// not given a wait at all.
func TestLoadedAnswerWait(t *testing.T) {
	bg := context.Background()
	short, cancel := context.WithTimeout(bg, 4*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name              string
		ctx               context.Context
		answerWait, setup time.Duration
		least, most       time.Duration
	}{
		{"an idle host's set-up", bg, time.Second, 5 * time.Millisecond, time.Second, time.Second},
		{"a loaded host's set-up", bg, time.Second, 400 * time.Millisecond, 4 * time.Second, 4 * time.Second},
		{"a set-up slower than the busy wait's", bg, time.Second, time.Minute, busyAnswerWait, busyAnswerWait},
		{"a longer RDMATimeout", bg, 30 * time.Second, time.Minute, 30 * time.Second, 30 * time.Second},
		{"a shorter RDMATimeout, set by the caller", bg, time.Millisecond, 400 * time.Millisecond, time.Millisecond, time.Millisecond},
		{"little time left to fall back in", short, time.Second, time.Minute, time.Second, 2 * time.Second},
		{"a dial that never falls back", bg, 0, time.Minute, 0, 0},
	} {
		if got := loadedAnswerWait(tc.ctx, tc.answerWait, tc.setup); got < tc.least || got > tc.most {
			t.Errorf("%s (RDMATimeout %v, set-up %v): waits %v, want %v to %v", tc.name, tc.answerWait, tc.setup, got, tc.least, tc.most)
		}
	}
}

// TestDialRetrying: a request that fails for a passing reason is made
// again, up to maxPortTries in all and while the context lasts; any other
// failure, and a timeout toward a host not known to answer or in a dial
// that may fall back, is the dial's at once.
func TestDialRetrying(t *testing.T) {
	ForgetFailures()
	t.Cleanup(ForgetFailures)
	busy := netip.MustParseAddrPort("198.18.0.7:7471")
	failures.Answered(busy)
	unknown := netip.MustParseAddrPort("198.18.0.8:7471")
	timedOut := &cm.EventError{Op: "connect", Event: cm.EventUnreachable, Status: -int(syscall.ETIMEDOUT)}
	portBusy := fmt.Errorf("%w: %w", cm.ErrLocalPortBusy, syscall.EADDRNOTAVAIL)
	refused := &cm.EventError{Op: "connect", Event: cm.EventRejected, Status: cm.RejectInvalidServiceID}
	connectErr := &cm.EventError{Op: "connect", Event: cm.EventConnectError, Status: -int(syscall.EPERM)}
	if r := fallback.Classify(connectErr); fallback.Remembers(r) {
		t.Errorf("a set-up that failed after the peer answered is classified %s, which the failure memory keeps", r)
	}
	ok := &Conn{}
	for _, tc := range []struct {
		name   string
		dst    netip.AddrPort
		policy fallback.Policy
		fails  []error // the attempts' errors, in turn; past them, success
		tries  int
		ok     bool
	}{
		{"a port clash, then success", unknown, fallback.Auto, []error{portBusy}, 2, true},
		{"port clashes past the bound", unknown, fallback.Auto, []error{portBusy, portBusy, portBusy, portBusy}, maxPortTries, false},
		{"rdma only: a busy host's timeouts, then success", busy, fallback.RDMAOnly, []error{timedOut, timedOut}, 3, true},
		{"rdma only: a busy host's timeouts past the bound", busy, fallback.RDMAOnly, []error{timedOut, timedOut, timedOut, timedOut}, maxPortTries, false},
		{"rdma only: a timeout toward a host not known to answer", unknown, fallback.RDMAOnly, []error{timedOut}, 1, false},
		{"may fall back: a busy host's timeout", busy, fallback.Auto, []error{timedOut}, 1, false},
		{"the set-up failed after the peer answered, then success", unknown, fallback.Auto, []error{connectErr}, 2, true},
		{"the set-up failed after the peer answered, past the bound", unknown, fallback.Auto, []error{connectErr, connectErr, connectErr}, maxPortTries, false},
		{"refused by a CM (nothing listens)", busy, fallback.RDMAOnly, []error{refused}, 1, false},
		{"refused by iWARP (TCP's reset)", busy, fallback.RDMAOnly, []error{&cm.EventError{Op: "connect", Event: cm.EventRejected, Status: -int(syscall.ECONNREFUSED)}}, 1, false},
	} {
		tries := 0
		c, err := dialRetrying(context.Background(), tc.dst, tc.policy, func() (*Conn, error) {
			tries++
			if tries <= len(tc.fails) {
				return nil, tc.fails[tries-1]
			}
			return ok, nil
		})
		if tries != tc.tries || (err == nil) != tc.ok || (c == ok) != tc.ok {
			t.Errorf("%s: %d tries, %v, %v; want %d tries, success %v", tc.name, tries, c, err, tc.tries, tc.ok)
		}
	}
	// A session's resume path (fallback.Auto: a timeout goes on to the
	// next path) makes its request again after a passing failure.
	for _, tc := range []struct {
		fails []error
		tries int
	}{{[]error{connectErr}, 2}, {[]error{portBusy, connectErr}, 3}, {[]error{timedOut}, 1}, {[]error{connectErr, connectErr, connectErr}, maxPortTries}} {
		tries := 0
		r, err := dialRetrying(context.Background(), busy, fallback.Auto, func() (resumedLink, error) {
			tries++
			if tries <= len(tc.fails) {
				return resumedLink{}, tc.fails[tries-1]
			}
			return resumedLink{peer: wire.Hello{Generation: 7}}, nil
		})
		if want := tc.tries > len(tc.fails); tries != tc.tries || (err == nil) != want || (r.peer.Generation == 7) != want {
			t.Errorf("resume after %v: %d tries, %v; want %d tries", tc.fails, tries, err, tc.tries)
		}
	}
	// The caller's context ends: no further try.
	ctx, cancel := context.WithCancel(context.Background())
	tries := 0
	_, err := dialRetrying(ctx, busy, fallback.RDMAOnly, func() (*Conn, error) {
		tries++
		cancel()
		return nil, portBusy
	})
	if tries != 1 || err == nil {
		t.Errorf("context ended in the first try: %d tries, %v; want 1 and its error", tries, err)
	}
}

// fakeRequest is a connection request whose answer the test gives.
type fakeRequest struct {
	answer               chan cm.Event
	disconnected, closed atomic.Int32
}

func (r *fakeRequest) WaitEvent(ctx context.Context) (cm.Event, error) {
	select {
	case ev := <-r.answer:
		return ev, nil
	case <-ctx.Done():
		return cm.Event{}, ctx.Err()
	}
}
func (r *fakeRequest) Disconnect() error { r.disconnected.Add(1); return nil }
func (r *fakeRequest) Close() error      { r.closed.Add(1); return nil }

// TestLateAnswerWatches: a request the dial gave up on is watched until it
// is answered: an accept is disconnected at once, and either answer
// forgets the timeout remembered for the peer; at most maxLateWatches are
// watched at once (beyond, nothing is kept); endLateWatches ends the rest,
// and every request is closed and its connection released.
func TestLateAnswerWatches(t *testing.T) {
	ForgetFailures()
	t.Cleanup(ForgetFailures)
	defer endLateWatches()
	dst := netip.MustParseAddrPort("198.18.0.9:7471")
	var released atomic.Int32
	release := func() { released.Add(1) }
	newReq := func() *fakeRequest { return &fakeRequest{answer: make(chan cm.Event, 1)} }

	attemptFailed(dst, errNoAnswer)
	accepted := newReq()
	if !watchLateAnswer(dst, accepted, release) {
		t.Fatal("the first watch was refused")
	}
	accepted.answer <- cm.Event{Type: cm.EventEstablished}
	for end := time.Now().Add(hangGuard); accepted.closed.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the answered request was not closed")
		}
	}
	if accepted.disconnected.Load() != 1 || released.Load() != 1 || failures.Recall(dst) != nil || !failures.Answers(dst) {
		t.Errorf("an accept after the dial gave up: disconnected %d, released %d, remembered %v",
			accepted.disconnected.Load(), released.Load(), failures.Recall(dst))
	}

	// Fill the watches; one more is refused.
	var held []*fakeRequest
	for end := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		late.Lock()
		n := late.n
		late.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d watches left", n)
		}
	}
	for range maxLateWatches {
		r := newReq()
		if !watchLateAnswer(dst, r, release) {
			t.Fatalf("watch %d refused", len(held))
		}
		held = append(held, r)
	}
	extra := newReq()
	if watchLateAnswer(dst, extra, release) || extra.closed.Load() != 0 {
		t.Errorf("watch %d taken", maxLateWatches+1)
	}
	rejected := held[0]
	rejected.answer <- cm.Event{Type: cm.EventRejected}
	endLateWatches()
	for _, r := range held {
		if r.closed.Load() != 1 || r.disconnected.Load() != 0 {
			t.Errorf("a watched request: closed %d, disconnected %d", r.closed.Load(), r.disconnected.Load())
		}
	}
	if n := released.Load(); n != 1+maxLateWatches {
		t.Errorf("%d connections released, want %d", n, 1+maxLateWatches)
	}
}
