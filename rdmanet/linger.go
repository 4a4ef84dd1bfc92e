package rdmanet

import (
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// lingerTimeout bounds how long a closed connection keeps delivering what
// was written before it disconnects.
const lingerTimeout = 5 * time.Second

// linger delivers what was written before Close, for up to lingerTimeout,
// then disconnects and releases the link and its registered memory. It
// runs after Close has waited for every call in flight (a service among
// them) and made kicks start none, so it is the link's only user: what it
// polls cannot race with anyone, and nobody touches the memory it frees.
//
// A resumable session's link may fail while it lingers: the session then
// resumes, within the same bound, and delivers the rest over the new link
// (session.go); so the link is read under c.mu at each turn.
func (c *Conn) linger() {
	defer close(c.released)
	c.mu.Lock()
	c.lingering = true
	c.eng.Drain()
	c.eng.Flush(c.link)
	c.mu.Unlock()
	end := time.Now().Add(lingerTimeout)
	timer := time.AfterFunc(lingerTimeout, c.wakeLink)
	defer timer.Stop()
	cs := c.poll.batch[:]
	for {
		c.mu.Lock()
		// The engine's dead-path check runs here now (Close stopped
		// the ticker), so a path that goes silent during the drain is
		// found, and a session resumes past it.
		if next := c.eng.NextTick(); !next.IsZero() && !time.Now().Before(next) {
			c.eng.Tick()
			c.eng.Flush(c.link)
			if c.eng.Lost() != nil && c.sess != nil {
				c.suspendLocked()
			}
		}
		wake := end
		if next := c.eng.NextTick(); !next.IsZero() && next.Before(wake) {
			wake = next
		}
		timer.Reset(time.Until(wake))
		drained, l := c.eng.Drained(), c.link
		c.mu.Unlock()
		if drained || !time.Now().Before(end) {
			break
		}
		if c.drainSweep(l, cs) {
			continue
		}
		if err := l.Arm(); err != nil {
			break
		}
		if c.drainSweep(l, cs) {
			continue
		}
		if err := l.Wait(); err != nil && err != link.ErrWoken {
			break
		}
	}
	c.mu.Lock()
	c.lingering = false // a resume that comes now is refused
	if c.sess != nil {
		c.sess.cancel()
	}
	l := c.link
	c.mu.Unlock()
	l.Disconnect()
	l.Close()
	if c.sess != nil {
		c.sess.end(c)
	}
	c.mem.close()
}

// wakeLink wakes whoever waits on the connection's link now.
func (c *Conn) wakeLink() {
	c.mu.Lock()
	l := c.link
	c.mu.Unlock()
	l.Wake()
}

// drainSweep takes one batch of completions from l while lingering.
func (c *Conn) drainSweep(l link.Link, cs []link.Completion) bool {
	n, err := l.Poll(cs)
	if err != nil || n == 0 {
		return false
	}
	c.mu.Lock()
	c.handleLocked(cs[:n])
	if c.eng.Lost() != nil && c.sess != nil {
		c.suspendLocked()
	}
	c.mu.Unlock()
	return true
}
