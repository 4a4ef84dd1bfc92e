package rdmanet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
)

// How a dial waits for the peer's answer to its connection request, and
// what it makes of silence. A host without RDMA never answers; a busy one
// answers late. Telling them apart matters: a fallback remembered for a
// busy host gives every dial there TCP for DefaultMemoryTTL. So a dial
// waits longer for a destination known to answer RDMA, does not remember
// the failures of one that answers (attemptFailed), and when it stops
// waiting leaves the request to finish in the background, so that a late
// answer is seen and forgets the timeout remembered for it.

// errNoAnswer and errNoBusyAnswer are a connection request the peer did not
// answer in time: within RDMATimeout, or, for a peer known to answer RDMA,
// within busyAnswerWait. They match context.DeadlineExceeded, which makes
// them a fallback.ReasonTimeout.
var (
	errNoAnswer     = fmt.Errorf("no answer to the RDMA connection request in time: %w", context.DeadlineExceeded)
	errNoBusyAnswer = fmt.Errorf("no answer to the RDMA connection request, even in the longer wait for a peer that answered RDMA recently: %w", context.DeadlineExceeded)
)

// busyAnswerWait is how long a dial waits for the answer of a peer that
// answered over RDMA within the failure memory's TTL: such a peer is busy,
// not without RDMA, and falling back would give the connection TCP for its
// whole life. It matches the bound a listener puts on one handshake.
const busyAnswerWait = defaultAcceptTimeout

// answerContext is ctx, also cancelled when dst leaves a connection request
// unanswered: after answerWait (Dialer.RDMATimeout), with the cause
// errNoAnswer, or, if by then dst is known to answer RDMA, after busyWait
// in all, with the cause errNoBusyAnswer. The longer wait takes at most half
// of what ctx has left, so that falling back to TCP stays possible. Zero
// answerWait means ctx alone bounds the wait.
func answerContext(ctx context.Context, dst netip.AddrPort, answerWait, busyWait time.Duration) (context.Context, func()) {
	if answerWait <= 0 {
		return ctx, func() {}
	}
	busyWait = fallbackRoom(ctx, busyWait)
	actx, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex
	stopped := false
	var timer *time.Timer
	mu.Lock() // the timer may fire before it is stored
	defer mu.Unlock()
	timer = time.AfterFunc(answerWait, func() {
		mu.Lock()
		defer mu.Unlock()
		// Asked when the wait ends, not when it starts: in a burst the
		// first answers come while later requests still wait.
		if rest := busyWait - answerWait; rest > 0 && !stopped && failures.Answers(dst) {
			timer = time.AfterFunc(rest, func() { cancel(errNoBusyAnswer) })
			return
		}
		cancel(errNoAnswer)
	})
	return actx, func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// setupAnswerFactor times a dial's own set-up is the least it waits for
// the peer's answer (loadedAnswerWait). The steps before the request
// (resolving the route, making the queue pair, registering memory) are the
// same kernel and CPU work the listener does before it can answer, and a
// process that took long over them is loaded, and reads its answer late:
// under the lab's emulated CPU with the host loaded, a first dial's set-up
// took hundreds of milliseconds and its answer came after the default
// RDMATimeout, so a slow handshake fell back to TCP as if the peer had no
// RDMA. On an idle host the set-up takes milliseconds, and RDMATimeout
// stands.
const setupAnswerFactor = 10

// loadedAnswerWait is answerWait, raised to setupAnswerFactor x setup, at
// most busyAnswerWait and half of what ctx has left, when it is the
// default RDMATimeout: a timeout the caller chose (a test's 1 ms, to see
// a fallback) is kept as given, and zero (no fallback: ctx alone bounds
// the wait) stays zero.
func loadedAnswerWait(ctx context.Context, answerWait, setup time.Duration) time.Duration {
	if answerWait != defaultRDMATimeout {
		return answerWait
	}
	return max(answerWait, fallbackRoom(ctx, min(setupAnswerFactor*setup, busyAnswerWait)))
}

// fallbackRoom is wait, cut to half of what ctx has left.
func fallbackRoom(ctx context.Context, wait time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return min(wait, time.Until(dl)/2)
	}
	return wait
}

// lateAnswerWait bounds how long a request the dial gave up on is watched:
// far beyond a busy host's delay, short enough to hold its resources
// (a cm ID, a connection's registered memory) only briefly.
const lateAnswerWait = 10 * time.Second

// maxLateWatches bounds the requests watched at once; beyond it a request
// is released at once, as if nothing could answer it.
const maxLateWatches = 16

// late tracks the watches.
var late struct {
	sync.Mutex
	n      int
	wg     sync.WaitGroup
	ctx    context.Context // every watch's parent
	cancel context.CancelFunc
}

// attemptFailed says why a dial's RDMA attempt to dst failed, and
// remembers it when it belongs to dst. A peer that answers RDMA (it did
// recently, or an RDMA listener there refused this request) was busy: the
// failure is not remembered and does not claim the host lacks RDMA.
func attemptFailed(dst netip.AddrPort, err error) *fallback.Error {
	why := &fallback.Error{Reason: fallback.Classify(err), Err: err}
	var ee *cm.EventError
	switch why.Reason {
	case fallback.ReasonTimeout:
		why.PeerAnswers = failures.Answers(dst)
		if errors.Is(err, errNoBusyAnswer) {
			// Silent for busyAnswerWait, which a busy peer is not: the next
			// dial waits RDMATimeout again, and its timeout counts as any.
			failures.ForgetAnswer(dst)
		}
	case fallback.ReasonRejected:
		// Only "nothing listens on that port" says something lasting about
		// the destination; a listener's own reject (an rdmanet server out of
		// resources, a full backlog) is a moment's refusal.
		why.PeerAnswers = errors.As(err, &ee) && !ee.NoListener()
	}
	failures.Remember(dst, why)
	return why
}

// lateAnswer records what the peer did with a request after the dial had
// stopped waiting: any answer shows its host answers RDMA, which forgets
// the timeout that was remembered for it.
func lateAnswer(dst netip.AddrPort, ev cm.EventType) {
	switch ev {
	case cm.EventEstablished, cm.EventRejected:
		failures.Answered(dst)
	}
}

// pendingRequest is a connection request's cm ID (*cm.ID) as a watch
// uses it.
type pendingRequest interface {
	WaitEvent(ctx context.Context) (cm.Event, error)
	Disconnect() error
	Close() error
}

// watchLateAnswer takes over a connection request to dst whose answer the
// dial no longer waits for (id, and what release frees: the connection
// made for it), waits for the answer in the background, and then releases
// both. It reports false, keeping nothing, when too many requests are
// watched already.
func watchLateAnswer(dst netip.AddrPort, id pendingRequest, release func()) bool {
	late.Lock()
	defer late.Unlock()
	if late.n >= maxLateWatches {
		return false
	}
	if late.ctx == nil {
		late.ctx, late.cancel = context.WithCancel(context.Background())
	}
	late.n++
	late.wg.Add(1)
	ctx, cancel := context.WithTimeout(late.ctx, lateAnswerWait)
	go func() {
		defer func() {
			cancel()
			late.Lock()
			late.n--
			late.Unlock()
			late.wg.Done()
		}()
		ev, err := id.WaitEvent(ctx)
		if err == nil && ev.Type == cm.EventEstablished {
			// The server accepted: its connection ends at once, as a TCP
			// server's does when a client that gave up closes.
			id.Disconnect()
		}
		id.Close()
		release()
		if err == nil {
			lateAnswer(dst, ev.Type)
		}
	}()
	return true
}

// watchUnanswered hands a request whose dial failed with err to
// watchLateAnswer if the failure is the peer's silence (errNoAnswer,
// errNoBusyAnswer); it reports whether the watch took id and what release
// frees. A plain connection's dial and a group's link both use it.
func watchUnanswered(err error, dst netip.AddrPort, id pendingRequest, release func()) bool {
	return (errors.Is(err, errNoAnswer) || errors.Is(err, errNoBusyAnswer)) && watchLateAnswer(dst, id, release)
}

// endLateWatches ends every watch now and waits for them to release what
// they hold (tests use it before counting leftover IDs).
func endLateWatches() {
	late.Lock()
	if late.cancel != nil {
		late.cancel()
		late.ctx, late.cancel = nil, nil
	}
	late.Unlock()
	late.wg.Wait()
}
