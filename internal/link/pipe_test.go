package link_test

import (
	"errors"
	"testing"
	"time"

	. "github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/linktest"
)

// hangGuard bounds every wait in these tests. It only turns a hang into a
// failure: no test compares how long something took against an upper bound.
const hangGuard = 10 * time.Second

// The helpers of link tests (internal/linktest), by the names these tests
// use.
var (
	checkGoroutines = linktest.CheckGoroutines
	newTestPipe     = linktest.NewPipes
	pollAll         = linktest.PollAll
	waitFor         = linktest.WaitFor
	kinds           = linktest.Kinds
	wantKinds       = linktest.WantKinds
	data            = linktest.Data
	control         = linktest.Control
	marker          = linktest.Marker
	post            = linktest.Post
	fill            = linktest.Fill
)

func testConfig() PipeConfig {
	return PipeConfig{
		SendRing: 4096, RecvRing: 4096,
		SendDepth: 8, RecvDepth: 4, ControlDepth: 2,
		RNRRetry: 7,
	}
}

func TestPipeCaps(t *testing.T) {
	ac := testConfig()
	bc := PipeConfig{SendRing: 100, RecvRing: 200, SendDepth: 3, RecvDepth: 5, ControlDepth: 1}
	a, b := newTestPipe(t, ac, bc)
	want := Caps{SendDepth: 3, RecvDepth: 5, ControlDepth: 1, Name: "memory", Transport: "memory"}
	if got := b.Caps(); got != want {
		t.Errorf("Caps: %+v, want %+v", got, want)
	}
	if len(b.SendRing()) != 100 || len(b.RecvRing()) != 200 {
		t.Errorf("rings: %d and %d bytes, want 100 and 200", len(b.SendRing()), len(b.RecvRing()))
	}
	al, ar := a.Addrs()
	bl, br := b.Addrs()
	if al == bl || ar != bl || br != al || !al.Addr().IsLoopback() || !bl.Addr().IsLoopback() {
		t.Errorf("addresses: a %v->%v, b %v->%v", al, ar, bl, br)
	}
	aa, _ := a.RecvRingKey()
	ba, _ := b.RecvRingKey()
	if aa == ba || aa < RingBase || ba < RingBase {
		t.Errorf("ring addresses %#x and %#x", aa, ba)
	}
	if got := b.Stats().RecvPosted; got != 5 {
		t.Errorf("b has %d receives posted at the start, want 5", got)
	}
}

// The pipe's Stats count what was posted and landed, and the receives
// posted (the suite, internal/linktest, checks where the bytes land).
func TestPipeStats(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	post(t, a,
		data(b, 0, 100, 1000, false, 1),
		data(b, 100, 50, 0, true, 2),
		data(b, 200, 0, 4096, false, 3),
		data(b, 300, 30, 4066, true, 4),
	)
	waitFor(t, b, 4)
	waitFor(t, a, 2)
	if got := a.Stats(); got.Posted != 4 || got.BytesLanded != 180 {
		t.Errorf("a's stats: %+v, want 4 posted and 180 bytes landed", got)
	}
	if got := b.Stats().RecvPosted; got != 0 {
		t.Errorf("b has %d receives posted after 4 messages, want 0", got)
	}
	if err := b.PostRecv(4); err != nil {
		t.Fatal(err)
	}
	if got := b.Stats().RecvPosted; got != 4 {
		t.Errorf("b has %d receives posted after reposting, want 4", got)
	}
	// Events: completions that came while armed.
	if got := b.Stats(); got.Events != 0 || got.Armed {
		t.Errorf("b never armed: %d events, armed %v", got.Events, got.Armed)
	}
	if err := b.Arm(); err != nil {
		t.Fatal(err)
	}
	if !b.Stats().Armed {
		t.Error("b is not armed after Arm")
	}
	post(t, a, data(b, 0, 10, 0, true, 5))
	waitFor(t, b, 1)
	if got := b.Stats(); got.Events != 1 || got.Armed {
		t.Errorf("b armed, then a message: %d events, armed %v; want 1, false", got.Events, got.Armed)
	}
	// Calls: a's two PostSends (the four requests in one), b's one Arm,
	// and the polls that took the completions.
	if got := a.Stats().Calls; got.PostSend != 2 || got.Arm != 0 || got.Wait != 0 || got.Poll == 0 {
		t.Errorf("a's calls %+v: want 2 PostSend calls, polls, no Arm or Wait", got)
	}
	if got := b.Stats().Calls; got.PostSend != 0 || got.Arm != 1 || got.Poll-got.EmptyPoll < 2 || got.Total() != got.Poll+1 {
		t.Errorf("b's calls %+v: want 1 Arm, polls that took completions, no other call", got)
	}
}

// Bytes are read from the send ring when the request lands, not when it is
// posted, as a device reads them.
func TestPipeDataReadAtLanding(t *testing.T) {
	a, b := newTestPipe(t, testConfig(), testConfig())
	b.StopReposting(true)
	if err := b.PostRecv(0); err != nil {
		t.Fatal(err)
	}
	// Use up b's receives, so that the next message waits.
	post(t, a, data(b, 0, 1, 0, false, 1), data(b, 0, 1, 0, false, 2), data(b, 0, 1, 0, false, 3), data(b, 0, 1, 0, true, 4))
	waitFor(t, a, 1)
	a.SendRing()[10] = 'x'
	post(t, a, data(b, 10, 1, 10, true, 5))
	a.SendRing()[10] = 'y'
	b.StopReposting(false)
	pollAll(t, b)
	if err := b.PostRecv(1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, a, 1)
	if got := b.RecvRing()[10]; got != 'y' {
		t.Errorf("b got %q, want 'y'", got)
	}
}

// Receives the pipe withholds (StopReposting) count against RecvDepth, and
// a PostSend that breaks the contract posts none of its requests (the
// suite, internal/linktest, checks the rest of the misuse).
func TestPipeMisuse(t *testing.T) {
	t.Run("withheld receives count", func(t *testing.T) {
		a, b := newTestPipe(t, testConfig(), testConfig())
		post(t, b, data(a, 0, 1, 0, true, 1))
		waitFor(t, a, 1)
		a.StopReposting(true)
		if err := a.PostRecv(1); err != nil {
			t.Fatalf("below the depth: %v", err)
		}
		if err := a.PostRecv(1); !errors.Is(err, ErrMisuse) {
			t.Fatalf("got %v, want a misuse error", err)
		}
	})
	t.Run("rejected requests are not posted", func(t *testing.T) {
		a, b := newTestPipe(t, testConfig(), testConfig())
		wrs := []SendWR{marker(b, 1), control(2, 0), control(3, 0), control(4, 0)}
		if err := a.PostSend(wrs); !errors.Is(err, ErrMisuse) {
			t.Fatalf("got %v, want a misuse error", err)
		}
		if s := a.Stats(); s.Posted != 0 {
			t.Errorf("%d requests posted after the error", s.Posted)
		}
	})
}

// After Close, the pipe's fault injection and Stats still work (the suite,
// internal/linktest, checks the Link calls).
func TestPipeFaultsAfterClose(t *testing.T) {
	a, _ := newTestPipe(t, testConfig(), testConfig())
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a.Wake()
	a.SetDelay(time.Second)
	a.StopReposting(true)
	a.FailNext(nil)
	a.Silence()
	a.Cut(nil)
	a.Stats()
}
