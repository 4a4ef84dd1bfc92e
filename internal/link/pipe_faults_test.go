package link_test

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/rdmanet/sdk/internal/link"
)

// goWait runs e.Wait in a goroutine and returns its result's channel.
func goWait(e *Pipe) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- e.Wait() }()
	return ch
}

// stillWaiting fails if the Wait behind ch returned within a moment. A slow
// machine can only make it miss a wrong return, never report a false one.
func stillWaiting(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("Wait returned %v, want it to sleep", err)
	case <-time.After(50 * time.Millisecond):
	}
}

// waitResult is the result of the Wait behind ch.
func waitResult(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(hangGuard):
		t.Fatal("Wait did not return")
		return nil
	}
}

// wantFailed checks that c is a Failed completion whose Err matches every
// target and none of the others.
func wantFailed(t *testing.T, who string, c Completion, targets []error, not ...error) {
	t.Helper()
	if c.Kind != Failed {
		t.Fatalf("%s's last completion: %v, want failed", who, c.Kind)
	}
	for _, target := range targets {
		if !errors.Is(c.Err, target) {
			t.Errorf("%s's error %q does not match %q", who, c.Err, target)
		}
	}
	for _, target := range not {
		if errors.Is(c.Err, target) {
			t.Errorf("%s's error %q matches %q", who, c.Err, target)
		}
	}
}

// wantOver checks that e reports nothing more and that Wait returns at once.
func wantOver(t *testing.T, who string, e *Pipe) {
	t.Helper()
	if cs := pollAll(t, e); len(cs) != 0 {
		t.Errorf("%s's Poll after the end: %q", who, kinds(cs))
	}
	if err := e.Arm(); err != nil {
		t.Fatal(err)
	}
	if err := waitResult(t, goWait(e)); err != nil {
		t.Errorf("%s's Wait after the end: %v", who, err)
	}
}

func TestPipeRemoteAccess(t *testing.T) {
	for _, tc := range []struct {
		name string
		wr   func(a, b *Pipe) SendWR
	}{
		{"wrong key", func(a, b *Pipe) SendWR {
			wr := data(b, 0, 10, 0, true, 2)
			wr.RKey++
			return wr
		}},
		{"past the end", func(a, b *Pipe) SendWR { return data(b, 0, 10, 4090, true, 2) }},
		{"far past the end", func(a, b *Pipe) SendWR { return data(b, 0, 10, 1<<31, true, 2) }},
		{"before the start", func(a, b *Pipe) SendWR {
			wr := data(b, 0, 10, 0, true, 2)
			wr.Remote--
			return wr
		}},
		{"ring offset as address", func(a, b *Pipe) SendWR {
			wr := data(b, 0, 10, 0, true, 2)
			wr.Remote = 0
			return wr
		}},
		{"own ring", func(a, b *Pipe) SendWR {
			wr := data(b, 0, 10, 0, true, 2)
			wr.Remote, wr.RKey = a.RecvRingKey()
			return wr
		}},
		{"marker with wrong key", func(a, b *Pipe) SendWR {
			wr := marker(b, 2)
			wr.RKey++
			return wr
		}},
		{"marker past the end", func(a, b *Pipe) SendWR {
			wr := marker(b, 2)
			wr.Remote += 4097
			return wr
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newTestPipe(t, testConfig(), testConfig())
			post(t, a, data(b, 0, 10, 0, true, 1), tc.wr(a, b), data(b, 0, 10, 0, true, 3))
			ca := waitFor(t, a, 2)
			wantKinds(t, "a", ca, "send-done 1", "failed")
			wantFailed(t, "a", ca[1], []error{ErrRemoteAccess}, ErrDown)
			cb := waitFor(t, b, 2)
			wantKinds(t, "b", cb, "data-arrived 10", "failed")
			wantFailed(t, "b", cb[1], []error{ErrRemoteAccess}, ErrDown)
			if got := a.Stats().BytesLanded; got != 10 {
				t.Errorf("%d bytes landed, want 10", got)
			}
			// Requests after the failure are flushed: accepted, never completed.
			post(t, a, data(b, 0, 10, 0, true, 4))
			wantOver(t, "a", a)
			wantOver(t, "b", b)
		})
	}
	t.Run("last byte", func(t *testing.T) {
		a, b := newTestPipe(t, testConfig(), testConfig())
		post(t, a, data(b, 0, 10, 4086, true, 1), marker(b, 2))
		m := marker(b, 3)
		m.Remote += 4096 // zero bytes at the end: inside
		post(t, a, m)
		wantKinds(t, "a", waitFor(t, a, 3), "send-done 1", "send-done 2", "send-done 3")
	})
}

func TestPipeRNRFatal(t *testing.T) {
	ac, bc := testConfig(), testConfig()
	ac.RNRRetry = 0
	bc.RecvDepth = 2
	a, b := newTestPipe(t, ac, bc)
	post(t, a, marker(b, 1), data(b, 0, 5, 0, true, 2), control(3, 1), data(b, 0, 5, 0, true, 4), marker(b, 5))
	ca := waitFor(t, a, 4)
	wantKinds(t, "a", ca, "send-done 1", "send-done 2", "send-done 3", "failed")
	wantFailed(t, "a", ca[3], []error{ErrRNR}, ErrDown)
	cb := waitFor(t, b, 3)
	wantKinds(t, "b", cb, "data-arrived 5", "control-arrived", "failed")
	wantFailed(t, "b", cb[2], []error{ErrRNR}, ErrDown)
	// A receive posted now comes too late.
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	wantOver(t, "a", a)
	wantOver(t, "b", b)
	if got := a.Stats().RNRWaits; got != 0 {
		t.Errorf("%d RNR waits, want 0", got)
	}
}

// With RNRRetry 7 a message waits for a receive, and everything after it
// waits behind it, markers too.
func TestPipeRNRWaits(t *testing.T) {
	bc := testConfig()
	bc.RecvDepth = 2
	a, b := newTestPipe(t, testConfig(), bc)
	post(t, a, data(b, 0, 1, 0, true, 1), data(b, 0, 2, 0, false, 2), data(b, 0, 3, 0, true, 3), control(4, 1), marker(b, 5))
	wantKinds(t, "b", waitFor(t, b, 2), "data-arrived 1", "data-arrived 2")
	wantKinds(t, "a", pollAll(t, a), "send-done 1")
	if s := a.Stats(); s.RNRWaits != 1 || s.BytesLanded != 3 {
		t.Errorf("a's stats: %+v, want 1 RNR wait and 3 bytes landed", s)
	}
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	wantKinds(t, "b", waitFor(t, b, 1), "data-arrived 3")
	wantKinds(t, "a", waitFor(t, a, 1), "send-done 3")
	if got := a.Stats().RNRWaits; got != 2 {
		t.Errorf("%d RNR waits, want 2 (the control waits now)", got)
	}
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	wantKinds(t, "b", waitFor(t, b, 1), "control-arrived")
	wantKinds(t, "a", waitFor(t, a, 2), "send-done 4", "send-done 5")
	if s := b.Stats(); s.RecvPosted != 0 {
		t.Errorf("b has %d receives posted, want 0", s.RecvPosted)
	}

	// The other way, and in a Wait: the waiting message lands when the
	// peer reposts while the sender sleeps.
	post(t, b, data(a, 0, 1, 0, true, 1), data(a, 0, 1, 0, true, 2), data(a, 0, 1, 0, true, 3), data(a, 0, 1, 0, true, 4), data(a, 0, 1, 0, true, 5))
	wantKinds(t, "b", pollAll(t, b), "send-done 1", "send-done 2", "send-done 3", "send-done 4")
	if err := b.Arm(); err != nil {
		t.Fatal(err)
	}
	w := goWait(b)
	stillWaiting(t, w)
	waitFor(t, a, 4)
	if err := a.PostRecv(4); err != nil {
		t.Fatal(err)
	}
	if err := waitResult(t, w); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	wantKinds(t, "b", pollAll(t, b), "send-done 5")
}

func TestPipeStopReposting(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	b.StopReposting(true)
	post(t, a, control(1, 1), data(b, 0, 1, 0, false, 2), data(b, 0, 1, 0, false, 3), data(b, 0, 1, 0, true, 4))
	waitFor(t, b, 4)
	if err := b.PostRecv(4); err != nil {
		t.Fatal(err)
	}
	if got := b.Stats().RecvPosted; got != 0 {
		t.Fatalf("b has %d receives posted, want 0", got)
	}
	waitFor(t, a, 2)
	post(t, a, data(b, 0, 7, 0, true, 5))
	if cs := pollAll(t, b); len(cs) != 0 {
		t.Fatalf("b got %q with no receive posted", kinds(cs))
	}
	if got := a.Stats().RNRWaits; got != 1 {
		t.Errorf("%d RNR waits, want 1", got)
	}
	b.StopReposting(false) // the withheld receives are posted now
	wantKinds(t, "b", waitFor(t, b, 1), "data-arrived 7")
	wantKinds(t, "a", waitFor(t, a, 1), "send-done 5")
	if got := b.Stats().RecvPosted; got != 3 {
		t.Errorf("b has %d receives posted, want 3", got)
	}
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	if got := b.Stats().RecvPosted; got != 4 {
		t.Errorf("b has %d receives posted, want 4", got)
	}
}

// A delay holds requests back at least that long, keeps them in order, and
// lowering it does not let later requests overtake.
func TestPipeDelay(t *testing.T) {
	const d = 100 * time.Millisecond
	a, b := newTestPipe(t, testConfig(), testConfig())
	a.SetDelay(d)
	start := time.Now()
	post(t, a, data(b, 0, 1, 0, true, 1))
	a.SetDelay(0)
	post(t, a, control(2, 1))
	post(t, a, data(b, 0, 2, 0, true, 3))
	wantKinds(t, "b", waitFor(t, b, 3), "data-arrived 1", "control-arrived", "data-arrived 2")
	if el := time.Since(start); el < d {
		t.Errorf("landed after %v, want at least %v", el, d)
	}
	wantKinds(t, "a", waitFor(t, a, 3), "send-done 1", "send-done 2", "send-done 3")
	if err := b.PostRecv(3); err != nil {
		t.Fatal(err)
	}

	// A disconnect does not wait behind delayed requests: as
	// rdma_disconnect, it flushes them and reaches the peer at once.
	a.SetDelay(time.Hour)
	post(t, a, data(b, 0, 3, 0, true, 4))
	if err := a.Disconnect(); err != nil {
		t.Fatal(err)
	}
	wantKinds(t, "b", waitFor(t, b, 1), "disconnected")
	wantKinds(t, "a", waitFor(t, a, 1), "disconnected")
}

// A long delay never blocks PostSend, and closing drops what is in flight
// without leaving a goroutine behind (newTestPipe checks).
func TestPipeDelayDoesNotBlock(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	a.SetDelay(time.Hour)
	for i := range 8 {
		post(t, a, data(b, 0, 1, 0, true, uint64(i)))
	}
	if cs := pollAll(t, b); len(cs) != 0 {
		t.Errorf("b got %q within the hour", kinds(cs))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	wantKinds(t, "b", waitFor(t, b, 1), "disconnected")
	wantOver(t, "b", b)
}

func TestPipeSilence(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	post(t, a, data(b, 0, 1, 0, true, 1))
	a.Silence()
	post(t, a, data(b, 0, 2, 0, true, 2), control(3, 1))
	post(t, b, data(a, 0, 3, 0, true, 1))
	// What landed before stays; nothing after it lands or completes.
	wantKinds(t, "a", pollAll(t, a), "send-done 1")
	wantKinds(t, "b", pollAll(t, b), "data-arrived 1")
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	if err := b.Arm(); err != nil {
		t.Fatal(err)
	}
	w := goWait(b)
	if err := a.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	stillWaiting(t, w)
	if cs := pollAll(t, b); len(cs) != 0 {
		t.Errorf("b got %q from a silent path", kinds(cs))
	}
	b.Wake()
	if err := waitResult(t, w); err != ErrWoken {
		t.Errorf("Wait: %v, want ErrWoken", err)
	}
	if s := a.Stats(); s.BytesLanded != 1 {
		t.Errorf("%d bytes landed, want 1", s.BytesLanded)
	}

	// A Cut still reports the failure.
	if err := b.Arm(); err != nil {
		t.Fatal(err)
	}
	w = goWait(b)
	stillWaiting(t, w)
	b.Cut(nil)
	if err := waitResult(t, w); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	cb := pollAll(t, b)
	wantKinds(t, "b", cb, "failed")
	wantFailed(t, "b", cb[0], []error{ErrDown})
}

func TestPipeCut(t *testing.T) {
	cable := errors.New("cable pulled")
	a, b := newTestPipe(t, testConfig(), testConfig())
	post(t, a, data(b, 0, 1, 0, true, 1))
	post(t, b, control(1, 1))
	a.SetDelay(time.Hour)
	post(t, a, data(b, 0, 2, 0, true, 2)) // outstanding: never completes
	if err := b.Arm(); err != nil {
		t.Fatal(err)
	}
	w := goWait(b)
	stillWaiting(t, w)
	b.Cut(cable) // either end cuts the whole path
	if err := waitResult(t, w); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	ca := waitFor(t, a, 3)
	wantKinds(t, "a", ca, "send-done 1", "control-arrived", "failed")
	wantFailed(t, "a", ca[2], []error{cable, ErrDown}, ErrRNR, ErrRemoteAccess)
	cb := waitFor(t, b, 3)
	wantKinds(t, "b", cb, "data-arrived 1", "send-done 1", "failed")
	wantFailed(t, "b", cb[2], []error{cable, ErrDown})
	a.Cut(errors.New("again")) // the connection already ended
	post(t, a, marker(b, 3))
	wantOver(t, "a", a)
	wantOver(t, "b", b)
}

func TestPipeFailNext(t *testing.T) {
	bad := errors.New("bad request")
	a, b := newTestPipe(t, testConfig(), testConfig())
	a.SetDelay(10 * time.Millisecond) // the failure waits its turn
	post(t, a, data(b, 0, 1, 0, true, 1), control(2, 1))
	a.FailNext(bad)
	post(t, a, data(b, 0, 2, 0, true, 3), data(b, 0, 3, 0, true, 4))
	ca := waitFor(t, a, 3)
	wantKinds(t, "a", ca, "send-done 1", "send-done 2", "failed")
	wantFailed(t, "a", ca[2], []error{bad}, ErrDown)
	cb := waitFor(t, b, 3)
	wantKinds(t, "b", cb, "data-arrived 1", "control-arrived", "failed")
	wantFailed(t, "b", cb[2], []error{bad}, ErrDown)
	wantOver(t, "a", a)
	wantOver(t, "b", b)

	t.Run("nil", func(t *testing.T) {
		a, b := newTestPipe(t, testConfig(), testConfig())
		a.FailNext(nil)
		post(t, a, marker(b, 1))
		ca := waitFor(t, a, 1)
		wantFailed(t, "a", ca[0], []error{ErrInjected})
	})
}

func TestPipeDisconnect(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	post(t, b, control(1, 1))
	a.SetDelay(20 * time.Millisecond)
	post(t, a, data(b, 0, 1, 0, true, 1))
	if err := a.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if err := a.Disconnect(); err != nil {
		t.Fatalf("second Disconnect: %v", err)
	}
	post(t, a, data(b, 0, 2, 0, true, 2)) // flushed
	// The delayed write had not landed: the disconnect flushed it.
	wantKinds(t, "b", waitFor(t, b, 2), "send-done 1", "disconnected")
	wantKinds(t, "a", waitFor(t, a, 2), "control-arrived", "disconnected")
	post(t, b, control(2, 1)) // flushed too: the connection is over
	if err := b.Disconnect(); err != nil {
		t.Fatal(err)
	}
	wantOver(t, "a", a)
	wantOver(t, "b", b)
	if got := a.Stats().BytesLanded; got != 0 {
		t.Errorf("%d bytes landed, want 0", got)
	}

	t.Run("both", func(t *testing.T) {
		a, b := newTestPipe(t, testConfig(), testConfig())
		b.SetDelay(10 * time.Millisecond)
		if err := a.Disconnect(); err != nil {
			t.Fatal(err)
		}
		if err := b.Disconnect(); err != nil {
			t.Fatal(err)
		}
		wantKinds(t, "a", waitFor(t, a, 1), "disconnected")
		wantKinds(t, "b", waitFor(t, b, 1), "disconnected")
		wantOver(t, "a", a)
		wantOver(t, "b", b)
	})
}

func TestPipeClose(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	post(t, a, data(b, 0, 1, 0, true, 1))
	if err := b.Arm(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	wantKinds(t, "b", waitFor(t, b, 2), "data-arrived 1", "disconnected")
	post(t, b, control(1, 1))
	if err := b.Disconnect(); err != nil {
		t.Fatal(err)
	}
	wantOver(t, "b", b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	t.Run("ends a Wait", func(t *testing.T) {
		a, _ := newTestPipe(t, testConfig(), testConfig())
		w := goWait(a)
		stillWaiting(t, w)
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := waitResult(t, w); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Wait: %v, want net.ErrClosed", err)
		}
	})
}

func TestPipeWake(t *testing.T) {
	a, _ := newTestPipe(t, testConfig(), testConfig())
	a.Wake()
	a.Wake() // Wakes do not pile up
	if err := waitResult(t, goWait(a)); err != ErrWoken {
		t.Fatalf("Wait after Wake: %v, want ErrWoken", err)
	}
	w := goWait(a)
	stillWaiting(t, w)
	a.Wake()
	if err := waitResult(t, w); err != ErrWoken {
		t.Fatalf("Wait: %v, want ErrWoken", err)
	}
}

// Only a completion that arrives after Arm ends a Wait.
func TestPipeArmEdge(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())

	// Not armed: a completion does not end the Wait.
	w := goWait(a)
	post(t, b, data(a, 0, 1, 0, false, 1))
	stillWaiting(t, w)

	// Armed after a completion arrived: that one does not count, the next does.
	if err := a.Arm(); err != nil {
		t.Fatal(err)
	}
	stillWaiting(t, w)
	post(t, b, data(a, 0, 1, 0, false, 2))
	if err := waitResult(t, w); err != nil {
		t.Fatalf("Wait: %v", err)
	}

	// One completion ends one Wait: the next sleeps, as it is not armed.
	post(t, b, data(a, 0, 1, 0, false, 3))
	w = goWait(a)
	stillWaiting(t, w)
	a.Wake()
	if err := waitResult(t, w); err != ErrWoken {
		t.Fatalf("Wait: %v, want ErrWoken", err)
	}

	// A completion between Arm and a second Arm is forgotten by the second.
	if err := a.Arm(); err != nil {
		t.Fatal(err)
	}
	post(t, b, data(a, 0, 1, 0, true, 4))
	if err := a.Arm(); err != nil {
		t.Fatal(err)
	}
	w = goWait(a)
	stillWaiting(t, w)
	a.Wake()
	if err := waitResult(t, w); err != ErrWoken {
		t.Fatalf("Wait: %v, want ErrWoken", err)
	}
	wantKinds(t, "a", pollAll(t, a), "data-arrived 1", "data-arrived 1", "data-arrived 1", "data-arrived 1")
}

// SetNotify's function is called for an event that finds no Wait running
// (a completion after Arm, the end), and not while a Wait runs.
func TestPipeNotify(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	var told atomic.Int32
	a.SetNotify(func() { told.Add(1) })

	post(t, b, data(a, 0, 1, 0, false, 1)) // not armed: nothing
	if err := a.Arm(); err != nil {
		t.Fatal(err)
	}
	post(t, b, data(a, 0, 1, 0, false, 2))
	if told.Load() != 1 {
		t.Fatalf("a completion after Arm with no Wait: told %d times, want 1", told.Load())
	}
	if err := a.Arm(); err != nil {
		t.Fatal(err)
	}
	w := goWait(a)
	stillWaiting(t, w) // the Wait runs
	post(t, b, data(a, 0, 1, 0, false, 3))
	if err := waitResult(t, w); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if told.Load() != 1 {
		t.Fatalf("a completion that ended a Wait: told %d times in all, want 1", told.Load())
	}
	b.Disconnect() // the end comes whether armed or not
	if told.Load() != 2 {
		t.Fatalf("the link's end with no Wait: told %d times in all, want 2", told.Load())
	}
	a.SetNotify(nil)
}
