package connfd

import (
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeLink is a link as the FD sees it: completions come at any time (from
// the test), a Wait sleeps until one comes or it is woken, and an armed
// link with no Wait running calls its notify function once (Kick).
type fakeLink struct {
	mu       sync.Mutex
	reads    int // completions that make the connection readable
	writes   int // completions that make it writable
	armed    bool
	waiting  int
	ev       chan struct{}
	notifyFn func()
	kicks    atomic.Int32
}

func newFakeLink() *fakeLink { return &fakeLink{ev: make(chan struct{}, 1)} }

// deliver is the device completing work: reads and writes more completions.
// An armed link's event also ends the next Wait, as rdmalink's does
// (arrived): a poller between its Arm and its Wait, whose Kick does
// nothing, must not sleep through it.
func (l *fakeLink) deliver(reads, writes int) {
	l.mu.Lock()
	l.reads += reads
	l.writes += writes
	var f func()
	switch {
	case l.waiting > 0:
		notify(l.ev)
	case l.armed:
		notify(l.ev)
		l.armed, f = false, l.notifyFn
	}
	l.mu.Unlock()
	if f != nil {
		l.kicks.Add(1)
		f()
	}
}

func (l *fakeLink) take() (reads, writes int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	reads, writes = l.reads, l.writes
	l.reads, l.writes = 0, 0
	return reads, writes
}

// sleepers is how many pollers sleep in Wait now.
func (l *fakeLink) sleepers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

func (l *fakeLink) wait() {
	l.mu.Lock()
	l.waiting++
	l.mu.Unlock()
	<-l.ev
	l.mu.Lock()
	l.waiting--
	l.mu.Unlock()
}

// fakeConn is a connection over a fakeLink: its "engine" counts what is
// readable and writable, and takes one unit per Read or Write.
type fakeConn struct {
	mu       sync.Mutex
	fd       FD
	link     *fakeLink
	readable int
	writable int
	failed   bool
	quiet    bool
	sweeps   [3]int // by batch
	arms     int
	waits    int
	ticks    int
	drained  func() bool
}

func newFakeConn(busyPoll time.Duration) *fakeConn {
	c := &fakeConn{link: newFakeLink()}
	c.fd.Init(&c.mu, c, busyPoll)
	c.link.notifyFn = c.fd.Kick
	c.mu.Lock()
	c.fd.SettleLocked()
	c.mu.Unlock()
	return c
}

func (c *fakeConn) SweepLocked(b Batch) bool {
	c.sweeps[b]++
	r, w := c.link.take()
	c.readable += r
	c.writable += w
	c.fd.ReadyLocked(c.readable > 0, c.writable > 0)
	return r+w > 0
}

func (c *fakeConn) ArmLocked() bool {
	c.arms++
	c.link.mu.Lock()
	c.link.armed = true
	c.link.mu.Unlock()
	return true
}

func (c *fakeConn) WaitLocked() (bool, error) {
	c.waits++
	c.mu.Unlock()
	c.link.wait()
	c.mu.Lock()
	return true, nil
}

func (c *fakeConn) WakeLocked()        { notify(c.link.ev) }
func (c *fakeConn) FailedLocked() bool { return c.failed }
func (c *fakeConn) QuietLocked() bool  { return c.failed || c.quiet }
func (c *fakeConn) TickLocked() time.Time {
	c.ticks++
	return time.Now().Add(5 * time.Millisecond)
}
func (c *fakeConn) DrainedLocked() bool { return c.drained != nil && c.drained() }

// read is a Read: it takes one readable unit, waiting for it.
func (c *fakeConn) read() error { return c.take(false) }

func (c *fakeConn) write() error { return c.take(true) }

func (c *fakeConn) take(write bool) error {
	if !c.fd.RWLock(!write) {
		return net.ErrClosed
	}
	defer c.fd.RWUnlock(!write)
	c.mu.Lock()
	defer c.mu.Unlock()
	n := &c.readable
	if write {
		n = &c.writable
	}
	for *n == 0 {
		if c.fd.DeadlinePassed(write) {
			return os.ErrDeadlineExceeded
		}
		if err := c.fd.WaitLocked(write); err != nil {
			return err
		}
	}
	*n--
	return nil
}

// eventually waits for cond, under c.mu, for up to hangGuard.
func (c *fakeConn) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(hangGuard); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("still not %s after %v", what, hangGuard)
		}
	}
}

func result(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func wantResult(t *testing.T, ch <-chan error, want error) {
	t.Helper()
	select {
	case err := <-ch:
		if !errors.Is(err, want) {
			t.Fatalf("call returned %v, want %v", err, want)
		}
	case <-time.After(hangGuard):
		t.Fatalf("call still blocked after %v", hangGuard)
	}
}

// TestFDIdleTakesCompletions: with no call waiting, a completion kicks a
// service that takes it, and leaves no goroutine behind.
func TestFDIdleTakesCompletions(t *testing.T) {
	base := runtime.NumGoroutine()
	c := newFakeConn(0)
	for i := 1; i <= 20; i++ {
		c.link.deliver(1, 0)
		c.eventually(t, "taken by a service", func() bool { return c.readable == i })
	}
	if k := c.link.kicks.Load(); k == 0 {
		t.Fatal("completions were taken with no kick")
	}
	for end := time.Now().Add(hangGuard); runtime.NumGoroutine() > base; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d goroutines with the connection idle, %d before it", runtime.NumGoroutine(), base)
		}
	}
	c.mu.Lock()
	waits := c.waits
	c.mu.Unlock()
	if waits != 0 {
		t.Fatalf("an idle connection slept in the link's Wait %d times", waits)
	}
}

// TestFDWaiterPolls: a blocked Read takes the poller's role and its
// completion wakes it from the link's Wait, with no kick.
func TestFDWaiterPolls(t *testing.T) {
	c := newFakeConn(0)
	ch := result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() && c.link.sleepers() > 0 })
	c.link.deliver(1, 0)
	wantResult(t, ch, nil)
	if k := c.link.kicks.Load(); k != 0 {
		t.Fatalf("%d kicks while a Read polled", k)
	}
}

// TestFDHandsRoleOn: a Write that waits while a Read polls gets the role
// when the Read returns, and then its own completion wakes it.
func TestFDHandsRoleOn(t *testing.T) {
	c := newFakeConn(0)
	r := result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() })
	w := result(c.write)
	c.eventually(t, "wanting", func() bool { return c.fd.wanting == 1 })
	c.link.deliver(1, 0)
	wantResult(t, r, nil)
	// Asleep in the link's Wait, not between its Arm and its Wait, where
	// the link's event rightly kicks (see deliver).
	c.eventually(t, "the Write asleep polling", func() bool {
		return c.fd.polling.Load() && c.fd.wanting == 0 && c.link.sleepers() > 0
	})
	kicks := c.link.kicks.Load()
	c.link.deliver(0, 1)
	wantResult(t, w, nil)
	if k := c.link.kicks.Load(); k != kicks {
		t.Fatal("the Write's completion kicked a service: nobody had the role")
	}
	c.eventually(t, "settled", func() bool { return !c.fd.polling.Load() })
}

// TestFDDeadlineWakesPoller: a deadline wakes a Read asleep in the link's
// Wait, and one in the past fails the next at once.
func TestFDDeadlineWakesPoller(t *testing.T) {
	c := newFakeConn(0)
	ch := result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() && c.waits > 0 })
	c.fd.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	wantResult(t, ch, os.ErrDeadlineExceeded)
	wantResult(t, result(c.read), os.ErrDeadlineExceeded)
	c.fd.SetReadDeadline(time.Time{})
	c.link.deliver(1, 0)
	wantResult(t, result(c.read), nil)
}

// TestFDWaiterDeadline: a deadline ends a Write that waits for the role.
func TestFDWaiterDeadline(t *testing.T) {
	c := newFakeConn(0)
	r := result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() })
	c.fd.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	wantResult(t, result(c.write), os.ErrDeadlineExceeded)
	c.link.deliver(1, 0)
	wantResult(t, r, nil)
}

// TestFDFailedConnection: a failed connection ends the poller's wait, and
// nobody polls it after.
func TestFDFailedConnection(t *testing.T) {
	c := newFakeConn(0)
	r := result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() && c.waits > 0 })
	c.mu.Lock()
	c.failed = true
	c.readable = 1 // the error is what a Read returns now
	c.fd.ReadyLocked(true, false)
	c.fd.WakePollerLocked()
	c.mu.Unlock()
	wantResult(t, r, nil)
	c.mu.Lock()
	sweeps := c.sweeps[PollerBatch]
	c.mu.Unlock()
	c.link.deliver(1, 0)
	time.Sleep(20 * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sweeps[PollerBatch] != sweeps || c.fd.polling.Load() {
		t.Fatal("a failed connection was polled")
	}
}

// TestFDCloseWakesCalls: Close wakes the poller and a waiter with
// net.ErrClosed, returns once they have, and kicks start nothing after.
func TestFDCloseWakesCalls(t *testing.T) {
	c := newFakeConn(0)
	r := result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() && c.waits > 0 })
	w := result(c.write)
	c.eventually(t, "wanting", func() bool { return c.fd.wanting == 1 })
	closed := make(chan struct{})
	go func() {
		if !c.fd.Close(func() { notify(c.link.ev) }) {
			t.Error("the first Close reported false")
		}
		close(closed)
	}()
	wantResult(t, r, net.ErrClosed)
	wantResult(t, w, net.ErrClosed)
	if !done(closed, hangGuard) {
		t.Fatal("Close did not return")
	}
	if c.fd.Close(func() {}) {
		t.Fatal("a second Close reported true")
	}
	c.mu.Lock()
	sweeps := c.sweeps
	c.link.armed = true
	c.mu.Unlock()
	c.link.deliver(1, 1)
	time.Sleep(20 * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sweeps != sweeps {
		t.Fatal("a kick after Close took completions: they are Linger's")
	}
}

// TestFDBusyPoll: with a busy-poll time, a Write beside a polling Read
// sweeps into its own batch.
func TestFDBusyPoll(t *testing.T) {
	c := newFakeConn(50 * time.Millisecond)
	// One quick round makes the connection busy.
	r := result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() && c.waits > 0 })
	c.link.deliver(1, 0)
	wantResult(t, r, nil)
	c.eventually(t, "busy", func() bool { return c.fd.busy })
	r = result(c.read)
	c.eventually(t, "polling", func() bool { return c.fd.polling.Load() })
	w := result(c.write)
	c.eventually(t, "spinning", func() bool { return c.sweeps[WriteSpinBatch] > 0 })
	c.link.deliver(1, 1)
	wantResult(t, w, nil)
	wantResult(t, r, nil)
}

// TestFDLinger: Linger runs the checks as they fall due and returns once
// drained, or at its timeout.
func TestFDLinger(t *testing.T) {
	c := newFakeConn(0)
	c.fd.Close(func() {})
	c.drained = func() bool { return c.readable >= 3 }
	go func() {
		for range 3 {
			time.Sleep(5 * time.Millisecond)
			c.link.deliver(1, 0)
		}
	}()
	if !c.fd.Linger(hangGuard) {
		t.Fatal("Linger did not drain")
	}

	c = newFakeConn(0)
	c.fd.Close(func() {})
	c.drained = func() bool { return false }
	start := time.Now()
	if c.fd.Linger(50 * time.Millisecond) {
		t.Fatal("Linger drained a link that never did")
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > hangGuard {
		t.Fatalf("Linger returned after %v, its timeout is 50ms", d)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ticks < 3 {
		t.Fatalf("%d checks in 50ms with one due every 5ms", c.ticks)
	}
}

// TestFDConcurrentClose: Closes that race each other close the FD once:
// one reports true, the others false, and none panics.
func TestFDConcurrentClose(t *testing.T) {
	for range 100 {
		c := newFakeConn(0)
		var wins atomic.Int32
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c.fd.Close(func() {}) {
					wins.Add(1)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("%d Closes reported true, want 1", wins.Load())
		}
	}
}
