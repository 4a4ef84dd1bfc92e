package connfd

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestAdaptiveSpinTime: adaptive polling (busyPoll 0) spins only while
// most recent waits were quick, for about four times the longest of them
// lately and at most maxAdaptiveSpin; it goes on after one long wait and
// stops after three in a row; every probeEvery-th wait of a connection that does not spin is a probe,
// and a quick one makes it spin again; never on a connection that has not
// waited yet or that waited for nothing in idleAfterWait; and never with
// busyPoll negative. Positive busyPoll keeps its fixed time.
func TestAdaptiveSpinTime(t *testing.T) {
	var fd FD
	if d := fd.spinLocked(); d != 0 {
		t.Fatalf("no wait yet: spins %v", d)
	}
	for range 4 {
		fd.tookLocked(time.Now(), 100*time.Microsecond, false)
	}
	if d := fd.spinLocked(); d < 400*time.Microsecond || d > 500*time.Microsecond {
		t.Fatalf("after waits of 100 µs: spins %v (longest %v), want about four times the wait", d, fd.waitHigh)
	}
	// Waits of two kinds: the spin covers the longer.
	for range 4 {
		fd.tookLocked(time.Now(), 400*time.Microsecond, false)
		fd.tookLocked(time.Now(), 50*time.Microsecond, false)
	}
	if d := fd.spinLocked(); d < 1500*time.Microsecond || d > maxAdaptiveSpin { // four times 400 µs, less the sixteenth a quick wait takes off
		t.Fatalf("after waits of 50 and 400 µs: spins %v (longest %v), want four times the longer", d, fd.waitHigh)
	}
	// The longest sinks once the long ones stop.
	for range 32 {
		fd.tookLocked(time.Now(), 100*time.Microsecond, false)
	}
	if d := fd.spinLocked(); d < 400*time.Microsecond || d > 500*time.Microsecond {
		t.Fatalf("after 32 waits of 100 µs: spins %v (longest %v), want about four times that", d, fd.waitHigh)
	}
	long := func() { fd.tookLocked(time.Now(), 5*quickWait, false) }
	long()
	if d := fd.spinLocked(); d < 400*time.Microsecond || d > 500*time.Microsecond {
		t.Fatalf("after one long wait among quick ones: spins %v (longest %v), want as before", d, fd.waitHigh)
	}
	long()
	long()
	if d := fd.spinLocked(); d != 0 {
		t.Fatalf("after three long waits in a row: spins %v", d)
	}
	// Waits that do not spin lead to a probe, which spins as long as a
	// spin may; a probe whose answer is late changes nothing.
	for i := 1; i < probeEvery-1; i++ {
		long()
		if d := fd.spinLocked(); d != 0 {
			t.Fatalf("%d long waits: spins %v before the probe", 3+i, d)
		}
	}
	if d := fd.spinLocked(); d != 0 {
		t.Fatalf("spins %v one wait before the probe", d)
	}
	long()
	if d := fd.spinLocked(); d != maxAdaptiveSpin {
		t.Fatalf("the probe spins %v, want %v", d, maxAdaptiveSpin)
	}
	long() // the probe's answer was late
	if d := fd.spinLocked(); d != 0 {
		t.Fatalf("after a late probe: spins %v", d)
	}
	for range probeEvery - 1 {
		long()
	}
	if d := fd.spinLocked(); d != maxAdaptiveSpin {
		t.Fatalf("the next probe spins %v, want %v", d, maxAdaptiveSpin)
	}
	fd.tookLocked(time.Now(), 300*time.Microsecond, false) // the probe's answer came while it spun
	if d := fd.spinLocked(); d < 1200*time.Microsecond || d > 1400*time.Microsecond {
		t.Fatalf("after a quick probe of 300 µs: spins %v (longest %v), want about four times that", d, fd.waitHigh)
	}
	fd.waitDone = time.Now().Add(-2 * idleAfterWait)
	if d := fd.spinLocked(); d != 0 {
		t.Fatalf("idle for %v: spins %v", 2*idleAfterWait, d)
	}
	// The first wait after an idle spell starts the longest afresh.
	fd.tookLocked(time.Now(), 100*time.Microsecond, false)
	if fd.waitHigh > 200*time.Microsecond || !fd.quickLocked() {
		t.Fatalf("longest %v, quick %v after an idle spell and a wait of 100 µs", fd.waitHigh, fd.quickLocked())
	}

	never := FD{busyPoll: -1}
	for range 4 {
		never.tookLocked(time.Now(), 100*time.Microsecond, false)
	}
	if d := never.spinLocked(); d != 0 || !never.waitDone.IsZero() {
		t.Fatalf("busyPoll negative: spins %v, waits recorded %v", d, never.waitDone)
	}
	fixed := FD{busyPoll: 50 * time.Microsecond}
	if d := fixed.spinLocked(); d != 0 {
		t.Fatalf("busyPoll fixed, not busy: spins %v", d)
	}
	fixed.busy = true
	if d := fixed.spinLocked(); d != 50*time.Microsecond {
		t.Fatalf("busyPoll fixed, busy: spins %v", d)
	}
}

// TestAdaptivePolledWaitsAreQuick: an answer's wait (on a connection that
// takes turns) that came while the poller polled counts as quick however
// long it took (under maxAnswerSpin), where a wait as long that slept
// counts as long; so a probe that catches a late answer by polling makes
// the connection poll again, as it must when the peer still sleeps. An
// answer's spin may last maxAnswerSpin; another wait's, maxAdaptiveSpin.
func TestAdaptivePolledWaitsAreQuick(t *testing.T) {
	var fd FD
	fd.takesTurns = true
	// Waits back to back, and the spin asked for at once, on a clock of
	// their own: a loaded machine that descheduled the test past
	// idleAfterWait would make them an idle connection's.
	took := func(d time.Duration, polledAnswer bool) {
		now := time.Now()
		if !fd.waitDone.IsZero() {
			now = fd.waitDone.Add(d)
		}
		fd.tookLocked(now, d, polledAnswer)
	}
	spin := func() time.Duration {
		fd.waitDone = time.Now()
		return fd.spinLocked()
	}
	for range 4 {
		took(100*time.Microsecond, false)
	}
	late := 3 * quickWait
	for range 8 {
		took(late, true)
	}
	if d := spin(); d != maxAnswerSpin {
		t.Fatalf("after 8 answers of %v that came while polling: spins %v, want %v", late, d, maxAnswerSpin)
	}
	fd.takesTurns = false
	if d := spin(); d != maxAdaptiveSpin {
		t.Fatalf("a wait that is not an answer's spins %v, want %v", d, maxAdaptiveSpin)
	}
	fd.takesTurns = true
	for range 3 {
		took(late, false)
	}
	if d := spin(); d != 0 {
		t.Fatalf("after 3 waits of %v that slept: spins %v", late, d)
	}
	for range probeEvery - 1 {
		took(late, false)
	}
	if d := spin(); d != maxAnswerSpin {
		t.Fatalf("the probe spins %v, want %v", d, maxAnswerSpin)
	}
	took(late, true) // the probe caught a late answer
	if d := spin(); d != maxAnswerSpin {
		t.Fatalf("after a probe that caught an answer of %v: spins %v, want %v", late, d, maxAnswerSpin)
	}
	for range 3 {
		took(maxAnswerSpin, true)
	}
	if d := spin(); d != 0 {
		t.Fatalf("after 3 waits of maxAnswerSpin: spins %v", d)
	}
}

// TestAdaptivePollCountsPolledWait: a Read after a write (an answer's wait)
// whose answer comes while it polls, later than quickWait, counts as
// quick: the connection's share of quick waits does not fall (the poller
// tells waitedLocked). A Read with no write before it (a stream's reader)
// counts the time alone: the share falls.
func TestAdaptivePollCountsPolledWait(t *testing.T) {
	for _, answer := range []bool{true, false} {
		spin := 4 * 900 * time.Microsecond // an answer's
		if !answer {
			spin = maxAdaptiveSpin
		}
		c := newFakeConn(0)
		for try := 0; ; try++ {
			c.mu.Lock()
			// Quick waits of 900 us: the Read polls for 2 ms (a stream's
			// cap), or 3.6 ms (an answer's).
			for range 4 {
				c.fd.tookLocked(time.Now(), 900*time.Microsecond, false)
			}
			waits, before := c.waits, c.fd.quickRate
			// A token left from an earlier sweep (the FD drops it).
			c.fd.ReadyLocked(true, false)
			if answer {
				c.fd.WroteLocked()
			}
			c.mu.Unlock()
			began := time.Now()
			ch := result(c.read)
			for end := time.Now().Add(hangGuard); !c.fd.polling.Load(); runtime.Gosched() {
				if time.Now().After(end) {
					t.Fatalf("the Read did not poll in %v", hangGuard)
				}
			}
			time.Sleep(quickWait + quickWait/4)
			c.link.deliver(1, 0)
			wantResult(t, ch, nil)
			c.mu.Lock()
			slept, rate := c.waits > waits, c.fd.quickRate
			c.mu.Unlock()
			// A loaded machine may deschedule the test, or the Read, past
			// the spin (the Read sleeps, or finds the answer when it
			// arms): try again.
			if !slept && time.Since(began) < spin {
				if answer && rate < before {
					t.Fatalf("an answer that came while polling, after %v, took the share of quick waits from %d to %d of %d", quickWait, before, rate, quickFull)
				}
				if !answer && rate >= before {
					t.Fatalf("a stream's Read that waited %v kept the share of quick waits at %d of %d (from %d)", quickWait, rate, quickFull, before)
				}
				break
			}
			if try == 19 {
				t.Fatalf("the Read's wait outlasted its spin (%v) in 20 tries", spin)
			}
		}
	}
}

// TestAdaptivePollTakesAnswer: on a connection whose waits were short, a
// Read whose answer comes while it polls takes it without sleeping in the
// link's Wait; with busyPoll negative the same Read sleeps.
func TestAdaptivePollTakesAnswer(t *testing.T) {
	// read starts a Read on a connection whose waits took 400 µs (it
	// polls for about 1.6 ms), delivers its answer once it has polled
	// twice, and reports whether it slept in the link's Wait. A loaded
	// machine may deschedule the test past the polling time: a few tries.
	read := func(c *fakeConn) (slept bool) {
		waits, sweeps := c.waitedShort()
		ch := result(c.read)
		for end := time.Now().Add(hangGuard); ; runtime.Gosched() {
			c.mu.Lock()
			ok := c.fd.polling.Load() && c.sweeps[PollerBatch] >= sweeps+2 || c.waits > waits
			c.mu.Unlock()
			if ok {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("the Read neither polled nor slept in %v", hangGuard)
			}
		}
		c.link.deliver(1, 0)
		wantResult(t, ch, nil)
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.waits > waits
	}
	c := newFakeConn(0)
	took := false
	for try := 0; try < 5 && !took; try++ {
		took = !read(c)
	}
	if !took {
		t.Fatal("a Read on a busy connection slept in the link's Wait for an answer that came while it polled, in 5 tries")
	}
	c = newFakeConn(-1)
	if !read(c) {
		t.Fatal("with busyPoll negative, a Read took its answer without sleeping")
	}
}

// TestFDRestsBeforeArming: the poller of a connection that polls and
// takes turns (its Read waited after a write, as for an answer) leaves the
// link unarmed when it stops, and a timer settles it armDelay later
// (restLocked): what came meanwhile is taken then, with no kick and no
// Read. A connection that does not poll, or whose wait was not a Read's
// after a write (a stream's reader or writer), arms at once.
func TestFDRestsBeforeArming(t *testing.T) {
	const (
		write  = iota // a write, then a Write's wait
		read          // a Read's wait with no write before it
		answer        // a write, then a Read's wait
	)
	for _, tc := range []struct {
		busyPoll time.Duration
		waits    []int // the last is checked; the ones before lead up to it
		rests    bool
		idle     bool // with a busy-poll time: its last sleep was long
	}{
		{0, []int{answer}, true, false},
		{0, []int{read, answer}, true, false},
		{-1, []int{answer}, false, false},
		{time.Millisecond, []int{answer}, true, false},
		{time.Millisecond, []int{answer}, false, true},
		{time.Millisecond, []int{read}, false, false},
		{0, []int{read}, false, false},
		{0, []int{answer, read}, false, false},
		{0, []int{write}, false, false},
		{0, []int{answer, write}, false, false},
	} {
		name := fmt.Sprintf("busyPoll %v (idle %v), waits %v", tc.busyPoll, tc.idle, tc.waits)
		c := newFakeConn(tc.busyPoll)
		c.link.deliver(1, 0)
		c.eventually(t, "taken by a service", func() bool { return c.readable == 1 })
		kicks := c.link.kicks.Load()

		c.mu.Lock()
		for range 4 {
			c.fd.tookLocked(time.Now(), 400*time.Microsecond, false)
		}
		// A busy-poll time polls once a sleep was short (sleepLocked).
		c.fd.busy = tc.busyPoll > 0 && !tc.idle
		var arms int
		stopped := time.Now()
		for _, w := range tc.waits {
			c.link.mu.Lock()
			c.link.armed = false // as the poller's completion's event left it
			c.link.mu.Unlock()
			arms, stopped = c.arms, time.Now()
			if w != read {
				c.fd.WroteLocked()
			}
			// Ready before the wait: the poller stops at once, as when a
			// spin took the answer.
			c.fd.ReadyLocked(w != write, w == write)
			if err := c.fd.WaitLocked(w == write); err != nil {
				c.mu.Unlock()
				t.Fatalf("%s: wait: %v", name, err)
			}
		}
		armedNow := c.arms > arms
		c.mu.Unlock()

		if !tc.rests {
			if !armedNow {
				t.Fatalf("%s: the link was left unarmed when the poller stopped", name)
			}
			continue
		}
		if armedNow {
			t.Fatalf("%s: the link was armed when the poller stopped", name)
		}
		c.link.deliver(1, 0)
		c.eventually(t, "taken once the connection rested", func() bool { return c.readable == 2 })
		if d := time.Since(stopped); d < armDelay {
			t.Fatalf("%s: taken %v after the poller stopped, before armDelay (%v)", name, d, armDelay)
		}
		if k := c.link.kicks.Load(); k != kicks {
			t.Fatalf("%s: %d kicks for a completion that came while the connection rested", name, k-kicks)
		}
		c.mu.Lock()
		armed := c.arms > arms
		c.mu.Unlock()
		if !armed {
			t.Fatalf("%s: the link was not armed after the connection rested", name)
		}
	}
}

// TestSpinSlots: no more waiters poll at once, process-wide, than
// GOMAXPROCS; a slot given back is taken again.
func TestSpinSlots(t *testing.T) {
	limit := runtime.GOMAXPROCS(0)
	for i := range limit {
		if !takeSpinSlot() {
			t.Fatalf("slot %d of %d refused", i+1, limit)
		}
	}
	if takeSpinSlot() {
		t.Fatalf("a slot beyond GOMAXPROCS (%d) given", limit)
	}
	releaseSpinSlot()
	if !takeSpinSlot() {
		t.Fatal("a slot given back was not given again")
	}
	for range limit {
		releaseSpinSlot()
	}
	// A Read with every slot held sleeps, whatever its waits were.
	for range limit {
		takeSpinSlot()
	}
	defer func() {
		for range limit {
			releaseSpinSlot()
		}
	}()
	c := newFakeConn(0)
	waits, sweeps := c.waitedShort()
	ch := result(c.read)
	c.eventually(t, "asleep", func() bool { return c.waits > waits })
	c.mu.Lock()
	if got := c.sweeps[PollerBatch] - sweeps; got > 2 {
		t.Errorf("the Read swept %d times before it slept, with no slot free", got)
	}
	c.mu.Unlock()
	c.link.deliver(1, 0)
	wantResult(t, ch, nil)
}

// waitedShort makes c's recent waits 400 µs each (adaptive polling would
// poll for about 1.6 ms) and returns its counts of Waits and of the
// poller's sweeps so far.
func (c *fakeConn) waitedShort() (waits, sweeps int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for range 4 {
		c.fd.tookLocked(time.Now(), 400*time.Microsecond, false)
	}
	return c.waits, c.sweeps[PollerBatch]
}
