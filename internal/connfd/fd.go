package connfd

import (
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// FD is a connection's file-descriptor role, as internal/poll's FD is a
// socket's: the calls in flight against Close with their locks (Mutex),
// the deadlines, waiting for the link's completions, and the drain after
// Close (Linger). What it waits on is a Driver: the connection's link and
// the protocol engine that handles its completions, under the
// connection's lock.
//
// Who takes completions. One goroutine at a time polls the link and sleeps
// in its Wait: the poller. A Read or Write that has to wait becomes the
// poller itself when the role is free, so the completion it waits for wakes
// it directly from the netpoller, with no hand-off through another
// goroutine (under the lab's emulation each hand-off between threads costs
// hundreds of microseconds). A waiter that finds someone else polling waits
// for it to say the call may go on (Ready) or to hand the role on (with a
// busy-poll time it sweeps meanwhile). A polling waiter is woken from the
// link's Wait (Driver.WakeLocked) when its deadline passes, the connection
// fails or it closes.
//
// When no Read or Write waits, nobody polls, and no goroutine of the
// connection's runs (as in Go's net, an idle connection has none): the
// last poller arms the link and sweeps once more (SettleLocked; on a
// connection that polls, armDelay later unless a poller came back), and
// the link calls Kick when a completion comes or it ends with no Wait
// running.
// Kick starts a short service that takes what came, so that receives are
// reposted, credit is returned and failures are noticed while the
// application does something else, arms again and returns. It never blocks
// its caller on the connection's lock.
//
// All of this is decided under the connection's lock, and completions are
// handled under it in the link's order whoever takes them. With a busy-poll
// time only the waiter spins: one spinner per connection.
type FD struct {
	Mutex // the calls in flight, their read and write locks, and closed

	mu       *sync.Mutex // the connection's lock: guards drv and the fields below
	drv      Driver
	busyPoll time.Duration

	readDeadline, writeDeadline Deadline
	readable, writable          chan struct{} // a Read or a Write may go on (capacity 1)
	closed                      chan struct{} // closed by Close

	// polling: a Read or Write is the poller. Written under the lock;
	// Kick, which does not take it, reads it too (a poller takes what
	// came: it polls, and settles once it stops).
	polling   atomic.Bool
	wanting   int           // blocked Reads and Writes waiting for the poller's role
	free      chan struct{} // the role is free for a waiter that wants it (capacity 1)
	busy      bool          // the poller's last sleep on the link was short (busy-poll)
	svc       atomic.Int32  // a service is scheduled (Kick)
	serviceFn func()        // service, bound once: a go statement on a method value allocates each time
	// restTimer settles the link once restUntil passed with no poller
	// running (restLocked); restTimed: it is set. A rest that starts
	// while it is set only moves restUntil, so that a busy connection
	// sets the timer once an armDelay, not once a Read.
	restTimer *time.Timer
	restUntil time.Time
	restTimed bool
	// wrote: the connection wrote since a Read last waited (Wrote);
	// takesTurns: the last wait was a Read's that followed a write, as
	// a request's answer is. Only such a connection rests: a stream's
	// reader that rested would leave the credit it frees to its next
	// Read, and its writer would wait for it.
	wrote, takesTurns bool
	// Adaptive polling (busyPoll 0): the share of recent waits for the
	// peer that were quick (quickRate, of quickFull: an exponential
	// average), how long the longest recent quick ones took (waitHigh: a
	// high-water mark that sinks by a sixteenth at each quick wait), when
	// the last wait ended, and the waits since the last probe while the
	// connection did not poll (probeEvery).
	quickRate int
	waitHigh  time.Duration
	waitDone  time.Time
	longWaits int
}

// Adaptive polling, the default (busyPoll 0), as the kernel's hybrid block
// polling: a Read or Write that has to wait, on a connection whose recent
// waits for its peer were mostly quick, polls for up to four times the
// longest of them before it sleeps, and never longer than maxAdaptiveSpin
// (maxAnswerSpin for an answer's wait: a Read's after a write, on a
// connection that takes turns). A wait is quick if it took less than
// quickWait, or if it was an answer's and came while the poller polled. A
// connection whose waits were mostly long, or with no wait in
// idleAfterWait, sleeps at once: an idle connection never spins.
//
//   - The share of quick waits decides, not their average: the odd late
//     answer (a peer or a device descheduled, a busy CPU) must not stop a
//     busy connection polling; three long waits in a row do.
//   - The longest quick wait sets the spin, not the average: a connection
//     waits for answers of several kinds (a request's, a window's, the
//     next request at a server), and a spin cut short by the quicker
//     kinds' average ends in the sleep that makes the slower kind's wait
//     long. The spin may outlast quickWait, to cover a quick kind's
//     stalls.
//   - Long waits can be the sleeps' own doing: an answer that takes a
//     wake-up at each end is slow because both ends sleep, and both keep
//     sleeping because it is slow. So every probeEvery-th wait of a
//     connection that does not poll polls for maxAdaptiveSpin all the
//     same, as a probe: if its answer is quick, the connection polls from
//     then on. A probe that finds nothing costs one spin in probeEvery
//     waits.
//   - An answer that came while the poller polled is quick whatever it
//     took (under maxAnswerSpin): a wait that slept took its own wake-up
//     too, which can cost more than quickWait on a busy host, and a
//     probe's answer comes from a peer that still sleeps. Both ends of a
//     connection probe once every probeEvery waits, in step, so that a
//     probe that had to find its answer under quickWait needed the
//     peer's probe at the same time: two processes that both slept once
//     could sleep for good. And an answer's spin may outlast a scheduler
//     tick's stall (4 ms at HZ 250: a thread woken on a busy CPU can
//     wait that long before it runs, and the answer it sends is that
//     late). A stream's waits (a writer's for room, a reader's for data)
//     keep the shorter cap and count only the time: they wait on a
//     transfer that the CPU they would spin on is moving (rxe copies in
//     its senders' and receivers' system calls).
//
// In the lab (emulated CPUs), the NBD example's 4 KiB reads one at a time
// took 1.2-1.7 ms on average with a spin of twice the average of all
// waits, capped at 1 ms (most waits ended asleep, at both ends), and
// 0.5-0.9 ms with the first three. A 64 B ping-pong between two processes
// waited on completion events 0.4-0.9 times a round trip at each end in
// most runs, for a mean of 1.6-2.8 ms, with answers that came while
// polling counted quick only under 1 ms and a spin of 2 ms at most; with
// the last rule, 0.02-0.17 times, for 0.4-1.2 ms (docs/lab.md, "A round
// trip between two processes"). The same rule for every wait cost
// streams in one process about a tenth of their throughput.
const (
	quickWait       = time.Millisecond
	maxAdaptiveSpin = 2 * quickWait
	maxAnswerSpin   = 5 * quickWait
	idleAfterWait   = 10 * quickWait
	probeEvery      = 16
	quickFull       = 256
)

// armDelay: the poller of a connection that polls (adaptive polling's
// quick waits, or a busy-poll time while busy) leaves the link unarmed
// when it stops, for up to this long, as NAPI defers a busy queue's
// interrupts (napi_defer_hard_irqs): the next Read or Write polls
// anyway, and an armed completion queue
// costs an event for a completion that is polled. On rxe each event is a
// tasklet, run by ksoftirqd when the CPUs are busy, and a busy CPU runs
// ksoftirqd late: in the lab a 64 B ping-pong between two processes
// that armed at every Read took a median 1.39 x as long (docs/lab.md,
// "Events a busy connection does not need"). A timer settles the
// link if no poller came back in time, so a completion that comes while
// the connection rests is taken at most armDelay late.
const armDelay = maxAnswerSpin

// Driver is what an FD waits on: a link and the engine that handles its
// completions. The methods named …Locked are called with the connection's
// lock held.
type Driver interface {
	// SweepLocked polls one batch of completions into the buffer named
	// by b, handles them, and reports whether there were any.
	SweepLocked(b Batch) bool
	// ArmLocked makes the link report its next completion (to a Wait, or
	// through Kick when none runs). It reports false if arming failed,
	// having failed the connection.
	ArmLocked() bool
	// WaitLocked sleeps in the link's Wait with the lock released, until
	// a completion, a wake-up or the link's end. It reports whether a
	// completion ended the sleep, and the error of a Wait that failed for
	// good on the link the connection still has (which fails with it,
	// unless it closes).
	WaitLocked() (completion bool, err error)
	// WakeLocked wakes whoever sleeps in the link's Wait.
	WakeLocked()
	// FailedLocked reports whether the connection has failed: nobody
	// need poll any more.
	FailedLocked() bool
	// QuietLocked reports whether nothing more can come that someone must
	// take while the connection is idle: it failed, it closes, or its
	// peer is gone.
	QuietLocked() bool
	// TickLocked runs the engine's checks that are due (a dead path is
	// found while lingering, too) and returns when the next is due, or
	// the zero time.
	TickLocked() time.Time
	// DrainedLocked reports whether what was written before Close has
	// been delivered.
	DrainedLocked() bool
}

// Batch names a completion buffer: the poller's, or the one a Read or a
// Write sweeps into with a busy-poll time while another goroutine polls
// (both directions may wait at once).
type Batch int

const (
	PollerBatch Batch = iota
	ReadSpinBatch
	WriteSpinBatch
)

// Service states (FD.svc): Kick starts a service only from svcIdle.
const (
	svcIdle int32 = iota
	svcScheduled
	svcClosed // Close: kicks start nothing
)

// Init makes fd open over d, whose calls are made under mu. With busyPoll
// positive, a waiter on a busy connection polls for up to that long before
// sleeping; with 0, for as long as the connection's recent waits took
// (adaptive polling, above); negative, never.
func (fd *FD) Init(mu *sync.Mutex, d Driver, busyPoll time.Duration) {
	fd.mu, fd.drv, fd.busyPoll = mu, d, busyPoll
	fd.serviceFn = fd.service
	fd.restTimer = time.AfterFunc(time.Hour, fd.rested)
	fd.restTimer.Stop()
	fd.readable = make(chan struct{}, 1)
	fd.writable = make(chan struct{}, 1)
	fd.free = make(chan struct{}, 1)
	fd.closed = make(chan struct{})
	fd.readDeadline.Init(fd.deadlinePassed)
	fd.writeDeadline.Init(fd.deadlinePassed)
}

// WroteLocked tells the FD that the connection posted bytes: a Read that
// waits after it waits for an answer, and its poller may rest
// (restLocked).
func (fd *FD) WroteLocked() { fd.wrote = true }

// SetReadDeadline sets the deadline for pending and future Reads.
func (fd *FD) SetReadDeadline(t time.Time) { fd.readDeadline.Set(t) }

// SetWriteDeadline sets the deadline for pending and future Writes.
func (fd *FD) SetWriteDeadline(t time.Time) { fd.writeDeadline.Set(t) }

// DeadlinePassed reports whether the Read (or the Write) deadline has
// passed.
func (fd *FD) DeadlinePassed(write bool) bool { return fd.deadline(write).Passed() }

func (fd *FD) deadline(write bool) *Deadline {
	if write {
		return &fd.writeDeadline
	}
	return &fd.readDeadline
}

// ReadyLocked tells a blocked Read (readable) or Write (writable) that it
// may go on: there is data, room, the end of the stream or an error.
func (fd *FD) ReadyLocked(readable, writable bool) {
	if readable {
		notify(fd.readable)
	}
	if writable {
		notify(fd.writable)
	}
}

// WakePollerLocked wakes the poller from the link's Wait, if one sleeps
// there: the connection failed.
func (fd *FD) WakePollerLocked() {
	if fd.polling.Load() {
		fd.drv.WakeLocked()
	}
}

// notify wakes one waiter without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Close refuses later calls, wakes the calls in flight (wake must wake
// those asleep in the link's Wait), and returns once they have all
// returned, a service among them; from then on kicks start nothing, and
// the link's completions are Linger's. It reports false if Close had
// begun already.
func (fd *FD) Close(wake func()) bool {
	// The state word decides who closes: only the first Close wakes, so
	// closed is closed once, however many Closes race.
	ok := fd.Mutex.Close(func() {
		close(fd.closed)
		wake()
	})
	fd.svc.Store(svcClosed)
	fd.restTimer.Stop()
	return ok
}

// Kick is the link's notify function: completions came, or the link ended,
// while no Wait ran. It starts a service unless one is scheduled already,
// or a Read or Write polls, not in the link's Wait (adaptive polling):
// the poller sweeps, and arms and sweeps once more when it stops
// (SettleLocked), so what came is taken either way.
func (fd *FD) Kick() {
	if fd.polling.Load() {
		return
	}
	if fd.svc.CompareAndSwap(svcIdle, svcScheduled) {
		go fd.serviceFn()
	}
}

// service takes what came while nobody polled, and leaves the link armed.
// A kick from the moment it holds the lock starts another service, which
// waits for this one: a completion after this one's Arm is not lost.
func (fd *FD) service() {
	if !fd.Incref() {
		return
	}
	defer fd.Decref()
	fd.mu.Lock()
	defer fd.mu.Unlock()
	fd.svc.CompareAndSwap(svcScheduled, svcIdle)
	fd.SettleLocked()
}

// SettleLocked makes the link report its next completion while nobody
// polls: unless a poller runs, or nothing more can come, it arms the link
// and polls once more, until a poll after the Arm finds nothing.
func (fd *FD) SettleLocked() {
	for !fd.polling.Load() && !fd.Mutex.Closed() && !fd.drv.QuietLocked() {
		if !fd.drv.ArmLocked() || !fd.drv.SweepLocked(PollerBatch) {
			return
		}
	}
}

// handOffLocked gives a free poller's role to a waiter that wants it, or
// else leaves the link armed for Kick: at once, or armDelay later for a
// connection that polls (restLocked).
func (fd *FD) handOffLocked() {
	switch {
	case fd.polling.Load():
	case fd.wanting > 0:
		notify(fd.free)
	case !fd.restLocked():
		fd.SettleLocked()
	}
}

// restLocked puts off the settle of a connection that polls and takes
// turns (a Read's wait after a write), and reports whether it did: rested
// settles it armDelay from now unless a poller runs then (each stopping
// poller puts it off again).
func (fd *FD) restLocked() bool {
	if !fd.takesTurns || !fd.pollsLocked() || fd.Mutex.Closed() || fd.drv.QuietLocked() {
		return false
	}
	fd.restUntil = time.Now().Add(armDelay)
	if !fd.restTimed {
		fd.restTimed = true
		fd.restTimer.Reset(armDelay)
	}
	return true
}

// rested settles the link of a connection that rested armDelay (restLocked):
// a poller that runs now settles it when it stops.
func (fd *FD) rested() {
	if !fd.Incref() {
		return
	}
	defer fd.Decref()
	fd.mu.Lock()
	defer fd.mu.Unlock()
	if d := time.Until(fd.restUntil); d > 0 {
		fd.restTimer.Reset(d) // a later rest began
		return
	}
	fd.restTimed = false
	fd.SettleLocked()
}

// deadlinePassed wakes a Read or Write that polls, when its deadline passes.
func (fd *FD) deadlinePassed() {
	fd.mu.Lock()
	if fd.polling.Load() && !fd.Mutex.Closed() {
		fd.drv.WakeLocked()
	}
	fd.mu.Unlock()
}

// sweepLocked sweeps unless Close has begun: then the link's completions
// are Linger's.
func (fd *FD) sweepLocked(b Batch) bool {
	return !fd.Mutex.Closed() && fd.drv.SweepLocked(b)
}

// sleepLocked arms the link, polls once more, and sleeps in the link's
// Wait until a completion, a wake-up or the link's end. Completion events
// are edge-like: arming after the link was found empty and polling once
// more before sleeping is what keeps a completion that landed in between
// from going unannounced.
func (fd *FD) sleepLocked() {
	if fd.Mutex.Closed() || !fd.drv.ArmLocked() || fd.sweepLocked(PollerBatch) || fd.drv.FailedLocked() {
		return
	}
	slept := time.Now()
	completion, _ := fd.drv.WaitLocked()
	if completion && fd.busyPoll > 0 {
		fd.busy = time.Since(slept) < 10*fd.busyPoll
	}
}

// spinning counts the waiters that poll under adaptive polling, in the
// process: at most GOMAXPROCS at once (takeSpinSlot), so that a server with
// thousands of busy connections has no more pollers than CPUs to run them,
// each yielding to the goroutines whose work the answers need; a waiter
// that finds no slot sleeps at once. A positive BusyPoll is the user's
// choice and takes none.
var spinning atomic.Int32

// TakeSpinSlot takes one of the process's spin slots for a waiter outside
// an FD (a link group's Open polling for its answer), as an FD's poller
// does; ReleaseSpinSlot gives it back. False: as many poll as there are
// CPUs, and the waiter sleeps at once.
func TakeSpinSlot() bool { return takeSpinSlot() }

// ReleaseSpinSlot gives back a slot TakeSpinSlot took.
func ReleaseSpinSlot() { releaseSpinSlot() }

func takeSpinSlot() bool {
	limit := int32(runtime.GOMAXPROCS(0))
	for {
		n := spinning.Load()
		if n >= limit {
			return false
		}
		if spinning.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func releaseSpinSlot() { spinning.Add(-1) }

// spinLocked is how long a waiter polls before it sleeps: busyPoll when
// the connection is busy, or adaptive polling's time.
func (fd *FD) spinLocked() time.Duration {
	switch {
	case fd.busyPoll > 0:
		if fd.busy {
			return fd.busyPoll
		}
		return 0
	case fd.busyPoll < 0 || fd.waitDone.IsZero() || time.Since(fd.waitDone) > idleAfterWait:
		return 0
	case !fd.quickLocked():
		if fd.probeDueLocked() {
			return fd.spinCapLocked()
		}
		return 0
	}
	return min(4*fd.waitHigh, fd.spinCapLocked())
}

// spinCapLocked is the longest adaptive spin of the wait that begins: an
// answer's (the connection takes turns) or another's.
func (fd *FD) spinCapLocked() time.Duration {
	if fd.takesTurns {
		return maxAnswerSpin
	}
	return maxAdaptiveSpin
}

// pollsLocked reports whether the connection's next wait polls: with a
// busy-poll time, while it is busy (its last sleep was short); with
// adaptive polling, while most recent waits were quick.
func (fd *FD) pollsLocked() bool {
	switch {
	case fd.busyPoll > 0:
		return fd.busy
	case fd.busyPoll < 0:
		return false
	}
	return !fd.waitDone.IsZero() && fd.quickLocked()
}

// quickLocked reports whether most recent waits were quick: the
// connection polls.
func (fd *FD) quickLocked() bool { return 2*fd.quickRate >= quickFull }

// probeDueLocked reports whether the next wait of a connection that does
// not poll is a probe (probeEvery): the wait that spinLocked spins for and
// waitedLocked counts as one.
func (fd *FD) probeDueLocked() bool { return fd.longWaits >= probeEvery-1 }

// startSpinLocked is how long a waiter polls now before it sleeps, and
// whether it took a spinning slot for it (adaptive polling), which it gives
// back when it stops polling; 0 with no slot free.
func (fd *FD) startSpinLocked() (spin time.Duration, slot bool) {
	spin = fd.spinLocked()
	switch {
	case spin <= 0 || fd.busyPoll > 0:
		return spin, false
	case takeSpinSlot():
		return spin, true
	}
	return 0, false
}

// waitedLocked records a wait that ended with the call able to go on, for
// adaptive polling; polledAnswer: it was an answer's (the connection takes
// turns) and came while the poller polled, before it slept.
func (fd *FD) waitedLocked(since time.Time, polledAnswer bool) {
	now := time.Now()
	fd.tookLocked(now, now.Sub(since), polledAnswer)
}

// tookLocked counts a wait of d that ended at now (waitedLocked; tests
// give d exactly, which two clock readings under load would not).
func (fd *FD) tookLocked(now time.Time, d time.Duration, polledAnswer bool) {
	if fd.busyPoll != 0 {
		return
	}
	quick, rate := d < quickWait || polledAnswer && d < maxAnswerSpin, 0
	if quick {
		rate = quickFull
	}
	fresh := fd.waitDone.IsZero() || now.Sub(fd.waitDone) > idleAfterWait
	probe := false
	if !fresh && !fd.quickLocked() {
		if probe = fd.probeDueLocked(); probe {
			fd.longWaits = 0
		} else {
			fd.longWaits++
		}
	}
	switch {
	case fresh || probe && quick:
		// A first wait, the first after an idle spell, or a probe's
		// quick answer: the share and the longest start from it.
		fd.quickRate, fd.waitHigh, fd.longWaits = rate, min(d, maxAnswerSpin), 0
	default:
		fd.quickRate += (rate - fd.quickRate) / 4
		if quick {
			fd.waitHigh = max(d, fd.waitHigh-fd.waitHigh/16)
		}
	}
	fd.waitDone = now
}

// WaitLocked releases the connection's lock until a Read (or a Write) may
// go on (ReadyLocked), its deadline passes or the connection closes; it
// returns os.ErrDeadlineExceeded or net.ErrClosed for the last two. The
// lock is held on entry and on return. The waiter becomes the poller if it
// can, and otherwise waits for the poller to say it may go on or to hand it
// the role. A Read calls it having found nothing to take under the lock:
// the readiness said before that is stale.
func (fd *FD) WaitLocked(write bool) error {
	fd.takesTurns = !write && fd.wrote
	if !write {
		fd.wrote = false
		// A token a Read left (it took data and left some, which made the
		// connection readable again) would end this wait at once, and the
		// Read's next wait would no longer be an answer's (wrote is taken).
		select {
		case <-fd.readable:
		default:
		}
	}
	ready, dl := fd.readable, &fd.readDeadline
	if write {
		ready, dl = fd.writable, &fd.writeDeadline
	}
	for {
		if !fd.polling.Load() && !fd.drv.FailedLocked() {
			return fd.pollForLocked(ready, dl)
		}
		// Another Read or Write polls (or the connection failed and nobody
		// needs to): wait for it to tell or to hand the role on; with a
		// busy-poll time, sweep meanwhile, so that a completion does not
		// have to wait for the netpoller, which busy CPUs look at seldom.
		if fd.polling.Load() {
			if spin, slot := fd.startSpinLocked(); spin > 0 {
				b := ReadSpinBatch
				if write {
					b = WriteSpinBatch
				}
				err, ok := fd.spinForLocked(spin, ready, dl, b)
				if slot {
					releaseSpinSlot()
				}
				if ok {
					return err
				}
				if !fd.polling.Load() {
					continue
				}
			}
		}
		fd.wanting++
		expired := dl.Expired()
		fd.mu.Unlock()
		var err error
		free := false
		select {
		case <-ready:
			// Not counted for adaptive polling: the poller's wait is.
		case <-expired:
			err = os.ErrDeadlineExceeded
		case <-fd.closed:
			err = net.ErrClosed
		case <-fd.free:
			free = true
		}
		fd.mu.Lock()
		fd.wanting--
		if !free {
			fd.handOffLocked()
			return err
		}
	}
}

// spinForLocked sweeps into b for up to spin while another goroutine is
// the poller; ok reports that the wait ended (with err).
func (fd *FD) spinForLocked(spin time.Duration, ready chan struct{}, dl *Deadline, b Batch) (err error, ok bool) {
	for end := time.Now().Add(spin); fd.polling.Load() && time.Now().Before(end); {
		select {
		case <-ready:
			return nil, true
		case <-dl.Expired():
			return os.ErrDeadlineExceeded, true
		case <-fd.closed:
			return net.ErrClosed, true
		default:
		}
		if !fd.sweepLocked(b) {
			fd.mu.Unlock()
			runtime.Gosched()
			fd.mu.Lock()
		}
	}
	return nil, false
}

// pollForLocked is WaitLocked as the poller: it polls the link (first for
// up to the busy-poll time, when the connection is busy) and sleeps in its
// Wait until ready fires, the deadline passes or the connection closes;
// then it hands the role on.
func (fd *FD) pollForLocked(ready chan struct{}, dl *Deadline) error {
	fd.polling.Store(true)
	start := time.Now()
	var spinUntil time.Time
	spin, slot := fd.startSpinLocked()
	if spin > 0 {
		spinUntil = start.Add(spin)
	}
	defer func() {
		if slot {
			releaseSpinSlot()
		}
	}()
	var err error
	slept := false          // the poller armed the link and slept in its Wait
	answer := fd.takesTurns // an answer's wait (a Write that waits meanwhile changes takesTurns)
	for {
		done := true
		select {
		case <-ready:
			fd.waitedLocked(start, answer && !slept)
		case <-dl.Expired():
			err = os.ErrDeadlineExceeded
		case <-fd.closed:
			err = net.ErrClosed
		default:
			done = false
		}
		if done || fd.drv.FailedLocked() {
			break
		}
		switch {
		case fd.sweepLocked(PollerBatch):
		case !spinUntil.IsZero() && time.Now().Before(spinUntil):
			// One spinner per connection, and it yields between polls:
			// the peer, the device and the engine may need this CPU.
			fd.mu.Unlock()
			runtime.Gosched()
			fd.mu.Lock()
		default:
			spinUntil = time.Time{}
			if slot {
				releaseSpinSlot()
				slot = false
			}
			slept = true
			fd.sleepLocked()
		}
	}
	fd.polling.Store(false)
	fd.handOffLocked()
	return err
}

// Linger drives the link alone after Close, until what was written before
// it is delivered (Driver.DrainedLocked) or timeout passes, running the
// engine's checks as they fall due; it reports whether it drained. It
// must run after Close returned: no call is in flight and kicks start
// nothing, so it is the link's only user.
func (fd *FD) Linger(timeout time.Duration) (drained bool) {
	end := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		fd.mu.Lock()
		fd.drv.WakeLocked()
		fd.mu.Unlock()
	})
	defer timer.Stop()
	fd.mu.Lock()
	defer fd.mu.Unlock()
	for {
		wake := end
		if next := fd.drv.TickLocked(); !next.IsZero() && next.Before(wake) {
			wake = next
		}
		timer.Reset(time.Until(wake))
		if fd.drv.DrainedLocked() {
			return true
		}
		if !time.Now().Before(end) {
			return false
		}
		if fd.drv.SweepLocked(PollerBatch) {
			continue
		}
		if !fd.drv.ArmLocked() {
			return fd.drv.DrainedLocked()
		}
		if fd.drv.SweepLocked(PollerBatch) {
			continue
		}
		if _, err := fd.drv.WaitLocked(); err != nil {
			return fd.drv.DrainedLocked()
		}
	}
}
