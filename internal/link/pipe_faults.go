package link

import (
	"errors"
	"fmt"
	"time"
)

// The faults a Pipe injects, and its counters. Every method here may be
// called from any goroutine at any time, also after Close.

// PipeStats are an end's counters, for tests.
type PipeStats struct {
	// Posted counts the send requests PostSend accepted, flushed ones too.
	Posted uint64
	// RecvPosted is how many receives are posted at this end now (not
	// counting those withheld by StopReposting).
	RecvPosted int
	// RNRWaits counts this end's messages that found no receive posted at
	// the peer and waited for one (each message once).
	RNRWaits uint64
	// BytesLanded counts the bytes of this end's SendData requests that
	// landed in the peer's ring.
	BytesLanded uint64
	// RingsMade, RingsReleased and RingsRefused count NewRecvRing's rings,
	// the receive rings given back, and the rings refused past RingLimit.
	RingsMade, RingsReleased, RingsRefused uint64
	// Events counts the completions that came while the end was armed:
	// each ends a Wait or calls the notify function, as a completion
	// event does on a device (on rxe, a tasklet each). Armed says whether
	// the end is armed now.
	Events uint64
	Armed  bool
	// Calls counts the end's calls of PostSend, Poll, Arm and Wait, each a
	// call into the device's library (cgo) on rdmalink.
	Calls PipeCalls
}

// PipeCalls counts calls of the verbs a round trip makes on a device.
type PipeCalls struct{ PostSend, Poll, EmptyPoll, Arm, Wait uint64 }

// Total is every call counted.
func (c PipeCalls) Total() uint64 { return c.PostSend + c.Poll + c.Arm + c.Wait }

// Stats returns the end's counters.
func (e *Pipe) Stats() PipeStats {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	s := e.stats
	s.RecvPosted = e.recvPosted
	s.Armed = e.armed
	return s
}

// SetDelay makes the requests this end posts from now on (and a Disconnect)
// land at the peer, and complete here, d after they were posted. Order is
// kept: a request never lands before one posted earlier, so after a delay is
// lowered, new requests wait behind the delayed ones. PostSend never blocks
// for it: a timer lands the requests.
func (e *Pipe) SetDelay(d time.Duration) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.delay = max(d, 0)
}

// StopReposting(true) makes this end's PostRecv calls succeed without posting
// anything, as a peer that stops reposting receives: the other end's
// messages soon find none. StopReposting(false) posts the receives withheld
// meanwhile, as a peer that catches up, and later calls post again.
func (e *Pipe) StopReposting(stop bool) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.stopRepost = stop
	if !stop && e.withheld > 0 {
		e.recvPosted += e.withheld
		e.withheld = 0
		e.peer.pump()
	}
}

// Silence makes the path go silent in both directions, as rxe does when a
// link goes down: nothing more lands, nothing more completes, no error is
// ever reported, and neither a Disconnect nor a Close reaches the other end.
// Completions already queued can still be polled. A Wait returns only for
// Wake or Close (or for a later Cut, which still reports Failed: the engine
// must find a silent path by its own timeouts).
func (e *Pipe) Silence() {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.pair.silent = true
	e.stopTimer()
	e.peer.stopTimer()
}

// Cut makes the path fail: each end that is still open gets a Failed
// completion, after what already landed, whose Err wraps both err (if not
// nil) and ErrDown. Requests still in flight never complete. Cut does nothing
// to a connection that already ended.
func (e *Pipe) Cut(err error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.pair.over {
		return
	}
	var cut error
	if err != nil {
		cut = fmt.Errorf("link: memory: path cut: %w: %w", err, ErrDown)
	} else {
		cut = fmt.Errorf("link: memory: path cut: %w", ErrDown)
	}
	c := Completion{Kind: Failed, Err: cut}
	e.pair.shut(e, c, c)
}

// errInjected is FailNext's error when it is given none.
var errInjected = errors.New("link: memory: injected failure")

// FailNext makes the next request this end posts fail when its turn to land
// comes: this end's Poll reports Failed, whose Err wraps err, after the
// completions of the requests before it; the peer's Poll reports Failed
// too, after what landed before, as a queue pair's error ends the reliable
// connection for both. A nil err means a generic injected failure.
func (e *Pipe) FailNext(err error) {
	if err == nil {
		err = errInjected
	}
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.failNext = err
}

// FailRegisterMem makes this end's RegisterMem fail with ErrRingsExhausted
// from now on, as registration fails on a device past the pinned-memory
// limit.
func (e *Pipe) FailRegisterMem() {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	e.failRegisterMem = true
}
