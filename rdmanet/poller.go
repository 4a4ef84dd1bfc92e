package rdmanet

import (
	"errors"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/rdmanet/sdk/internal/connfd"
	"github.com/rdmanet/sdk/internal/link"
)

// Who takes completions. One goroutine at a time polls the link and sleeps
// in its Wait: the poller. A Read or Write that has to wait becomes the
// poller itself when the role is free, so the completion it waits for wakes
// it directly from the netpoller, with no hand-off through another
// goroutine (under the lab's emulation each hand-off between threads costs
// hundreds of microseconds). A waiter that finds someone else polling waits
// for it to notify or to hand the role on (with BusyPoll it sweeps
// meanwhile). A polling waiter is woken from the link's Wait (link.Wake)
// when its deadline passes, the connection fails or closes.
//
// When no Read or Write waits, nobody polls, and no goroutine of the
// connection's runs (as in Go's net, an idle connection has none): the
// last poller arms the link and sweeps once more (settleLocked), and the
// link calls kick when a completion comes or it ends with no Wait running
// (link.Link's SetNotify; on RDMA, from the device's one dispatcher). kick
// starts a short service that takes what came, so that receives are
// reposted, credit is returned and failures are noticed while the
// application does something else, arms again and returns. It never
// blocks the caller on the connection's lock.
//
// All of this is decided under c.mu, and completions are handled under c.mu
// in the link's order whoever takes them (sweep). With BusyPoll only the
// waiter spins: one spinner per connection.

// pollerState is the poller's role and the buffers its holders poll into.
type pollerState struct {
	polling bool          // a Read or Write is the poller
	wanting int           // blocked Reads and Writes waiting for the poller's role
	free    chan struct{} // the role is free for a waiter that wants it (capacity 1)
	busy    bool          // the poller's last sleep on the link was short (BusyPoll)
	// Completions the poller takes in one batch, and those a Read or Write
	// sweeps for itself with BusyPoll while another goroutine polls (one
	// array per direction: both may wait).
	batch, readSpin, writeSpin [pollBatch]link.Completion
}

// pollBatch is how many completions one Poll takes.
const pollBatch = 32

// handOffLocked gives a free poller's role to a waiter that wants it, or
// else leaves the link armed for kick; c.mu is held.
func (c *Conn) handOffLocked() {
	if c.poll.polling {
		return
	}
	if c.poll.wanting > 0 {
		notify(c.poll.free)
	} else {
		c.settleLocked()
	}
}

// Service states (Conn.svc): kick starts a service only from svcIdle.
const (
	svcIdle int32 = iota
	svcScheduled
	svcClosed // Close: kicks start nothing
)

// kick is the link's notify function: completions came, or the link ended,
// while no Wait ran. It starts a service unless one is scheduled already.
func (c *Conn) kick() {
	if c.svc.CompareAndSwap(svcIdle, svcScheduled) {
		go c.service()
	}
}

// service takes what came while nobody polled, and leaves the link armed.
// A kick from the moment it is under c.mu starts another service, which
// waits for this one: a completion after this one's Arm is not lost.
func (c *Conn) service() {
	if !c.fd.Incref() {
		return
	}
	defer c.fd.Decref()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.svc.CompareAndSwap(svcScheduled, svcIdle)
	c.settleLocked()
}

// settleLocked makes the link report its next completion while nobody
// polls: unless a poller runs, or nothing more can come (the connection
// failed, closes or its peer is gone), it arms the link and polls once
// more, until a poll after the Arm finds nothing. c.mu is held.
func (c *Conn) settleLocked() {
	cs := c.poll.batch[:]
	for !c.poll.polling && !c.closing && c.eng.Err() == nil && !c.eng.PeerGone() {
		if err := c.link.Arm(); err != nil {
			c.eng.Fail(err)
			c.wakeReadyLocked()
			return
		}
		if !c.sweepLocked(cs) {
			return
		}
	}
}

// deadlinePassed wakes a Read or Write that polls, when its deadline passes.
func (c *Conn) deadlinePassed() {
	c.mu.Lock()
	if c.poll.polling && !c.closing {
		c.link.Wake()
	}
	c.mu.Unlock()
}

// sweepLocked polls one batch of completions and handles them; it reports
// whether there were any. Whoever polls does it under c.mu, so batches are
// taken and handled one at a time, in the link's order, which the send
// queue's accounting and the stream (a Shutdown after its data) rely on.
func (c *Conn) sweepLocked(cs []link.Completion) bool {
	if c.closing {
		return false
	}
	n, err := c.link.Poll(cs)
	if err != nil {
		c.eng.Fail(err)
		c.wakeReadyLocked()
		return false
	}
	if n == 0 {
		return false
	}
	c.handleLocked(cs[:n])
	c.wakeReadyLocked()
	return true
}

// handleLocked gives a batch of completions to the engine and posts what
// it answers with; c.mu is held.
func (c *Conn) handleLocked(cs []link.Completion) {
	for i := range cs {
		if cs[i].Kind == link.Disconnected && c.sess != nil {
			switch {
			case c.sess.state == sessionMoving:
				// The server let go of the link this side is moving from.
				cs[i] = link.Completion{Kind: link.Failed, Err: errFailback}
			case c.sess.state == sessionAttaching:
				// The dialer let go of the link it is moving from: its
				// new link is established, and resumeEnd may not have
				// run yet.
				cs[i] = link.Completion{Kind: link.Failed, Err: errResumedElsewhere}
			}
			// Any other end of the link is the peer closing only if its
			// Close came first (wire.FeatureClose): the engine takes it
			// for a lost link otherwise, and the session resumes.
		}
		c.eng.Handle(&cs[i])
	}
	c.eng.AfterCompletions()
	c.eng.Flush(c.link)
	clear(cs) // drop references to errors
	if s := c.sess; s != nil && s.unconfirmed && !c.eng.Resuming() && c.eng.Lost() == nil {
		// The dialer's first message on the new link came: it has the
		// generation this side gave out, and names it from now on.
		s.gen, s.next, s.unconfirmed = s.next, 0, false
	}
}

// sleep arms the link, polls once more, and sleeps in the link's Wait until
// a completion, a wake-up or the link's end; it reports whether it took
// completions instead of sleeping. Completion events are edge-like: arming
// after the link was found empty and polling once more before sleeping is
// what keeps a completion that landed in between from going unannounced.
// A Wait that fails for good fails the connection with its error.
func (c *Conn) sleep(cs []link.Completion) (took bool) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return false
	}
	if err := c.link.Arm(); err != nil {
		c.eng.Fail(err)
		c.wakeReadyLocked()
		c.mu.Unlock()
		return false
	}
	if c.sweepLocked(cs) {
		c.mu.Unlock()
		return true
	}
	if c.eng.Err() != nil {
		c.mu.Unlock()
		return false
	}
	// The link may change while the poller sleeps on it (a session's link
	// fails over): the one it waits on is the one it woke from.
	l := c.link
	c.waitLink = l // a session retiring l waits until it is not (session.go)
	c.mu.Unlock()
	slept := time.Now()
	err := l.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waitLink = nil
	if err != nil && !errors.Is(err, link.ErrWoken) {
		if !c.closing && l == c.link {
			c.eng.Fail(err)
			c.wakeReadyLocked()
		}
		return false
	}
	if err == nil && c.cfg.BusyPoll > 0 {
		c.poll.busy = time.Since(slept) < 10*c.cfg.BusyPoll
	}
	return false
}

// waitLocked releases c.mu until ready fires, the deadline passes or the
// connection closes; it returns the error that ends the wait, if any. c.mu
// is held on entry and on return. The waiter becomes the poller if it can
// (see "Who takes completions"), and otherwise waits for the poller to
// notify it or to hand it the role.
func (c *Conn) waitLocked(ready chan struct{}, dl *connfd.Deadline) error {
	for {
		if !c.poll.polling && c.eng.Err() == nil {
			return c.pollForLocked(ready, dl)
		}
		// Another Read or Write polls (or the connection failed and nobody
		// needs to): wait for it to notify or to hand the role on; with
		// BusyPoll, sweep meanwhile, so that a completion does not have to
		// wait for the netpoller, which busy CPUs look at seldom.
		if c.cfg.BusyPoll > 0 && c.poll.busy && c.poll.polling {
			if err, ok := c.spinForLocked(ready, dl); ok {
				return err
			}
			if !c.poll.polling {
				continue
			}
		}
		c.poll.wanting++
		expired := dl.Expired()
		c.mu.Unlock()
		var err error
		free := false
		select {
		case <-ready:
		case <-expired:
			err = os.ErrDeadlineExceeded
		case <-c.closed:
			err = net.ErrClosed
		case <-c.poll.free:
			free = true
		}
		c.mu.Lock()
		c.poll.wanting--
		if !free {
			c.handOffLocked()
			return err
		}
	}
}

// spinForLocked sweeps for up to Config.BusyPoll while another goroutine
// is the poller; ok reports that the wait ended (with err). c.mu is held on
// entry and on return.
func (c *Conn) spinForLocked(ready chan struct{}, dl *connfd.Deadline) (err error, ok bool) {
	cs := c.poll.readSpin[:8]
	if ready == c.writable {
		cs = c.poll.writeSpin[:8]
	}
	for end := time.Now().Add(c.cfg.BusyPoll); c.poll.polling && time.Now().Before(end); {
		select {
		case <-ready:
			return nil, true
		case <-dl.Expired():
			return os.ErrDeadlineExceeded, true
		case <-c.closed:
			return net.ErrClosed, true
		default:
		}
		if !c.sweepLocked(cs) {
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
	}
	return nil, false
}

// pollForLocked is waitLocked as the poller: it polls the link (first for
// up to Config.BusyPoll, when the connection is busy) and sleeps in its
// Wait until ready fires, the deadline passes or the connection closes;
// then it hands the role on. c.mu is held on entry and on return.
func (c *Conn) pollForLocked(ready chan struct{}, dl *connfd.Deadline) error {
	c.poll.polling = true
	cs := c.poll.batch[:]
	var spinUntil time.Time
	if c.cfg.BusyPoll > 0 && c.poll.busy {
		spinUntil = time.Now().Add(c.cfg.BusyPoll)
	}
	var err error
	for {
		done := true
		select {
		case <-ready:
		case <-dl.Expired():
			err = os.ErrDeadlineExceeded
		case <-c.closed:
			err = net.ErrClosed
		default:
			done = false
		}
		if done || c.eng.Err() != nil {
			break
		}
		switch {
		case c.sweepLocked(cs):
		case !spinUntil.IsZero() && time.Now().Before(spinUntil):
			// One spinner per connection, and it yields between polls:
			// the peer, the device and the engine may need this CPU.
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		default:
			spinUntil = time.Time{}
			c.mu.Unlock()
			c.sleep(cs)
			c.mu.Lock()
		}
	}
	c.poll.polling = false
	c.handOffLocked()
	return err
}
