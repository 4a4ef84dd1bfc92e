package rdmanet

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// Failback: a session the dialer moved to another path than its first (the
// first RDMA path, to the dialed address) tries, every FailbackInterval at
// most and with backoff, to move back. It makes the new link before it lets
// go of the old: it resumes on the first path while the current link still
// runs. If that fails (the path is still broken) nothing has changed. If it
// works, the server suspends the session's old link for the new one
// (resumeEnd), the dialer suspends its own, and attaches the new link.
// Each side may see the old link's end, closed by the other, before it
// suspended the link itself: that end is a move, not the peer's close
// (moving on the dialer, attaching on the server; handleLocked).

// defaultFailbackInterval is Config.FailbackInterval's default.
const defaultFailbackInterval = 30 * time.Second

// errFailback suspends the link a dialer moves away from.
var errFailback = fmt.Errorf("rdmanet: the session moves back to its first path: %w", link.ErrDown)

// scheduleFailbackLocked arms the next try, when the session is on another
// path than its first; c.mu is held.
func (c *Conn) scheduleFailbackLocked() {
	s := c.sess
	if s.paths == nil || s.pathIndex == 0 || c.cfg.FailbackInterval < 0 || c.closing {
		s.failbackWait = 0
		return
	}
	interval := cmp.Or(c.cfg.FailbackInterval, defaultFailbackInterval)
	if s.failbackWait == 0 {
		s.failbackWait = interval
	}
	if s.failbackTimer != nil {
		s.failbackTimer.Stop()
	}
	s.failbackTimer = time.AfterFunc(s.failbackWait, c.failback)
}

// failback tries once to move the session back to its first path.
func (c *Conn) failback() {
	c.mu.Lock()
	s := c.sess
	if c.closing || c.eng.Err() != nil || c.link == link.Link(s.lost) || s.pathIndex == 0 || s.state != sessionActive {
		c.mu.Unlock()
		return
	}
	s.setStateLocked(sessionMoving)
	h := c.resumeHelloLocked()
	first, from := s.paths[0], s.path
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), resumeAnswerWait+time.Second)
	l, peer, err := first.dial(ctx, h)
	cancel()

	c.mu.Lock()
	if err != nil {
		c.stepEndedLocked(sessionMoving)
		interval := cmp.Or(c.cfg.FailbackInterval, defaultFailbackInterval)
		s.failbackWait = min(2*s.failbackWait, 8*interval)
		if c.link == link.Link(s.lost) {
			// The server had begun to take the session over, and failed:
			// its end of the old link is gone. Resume as after any loss.
			if c.eng.Err() == nil && !c.closing {
				c.startRecoveryLocked(s.why)
			}
		} else {
			c.scheduleFailbackLocked()
		}
		c.mu.Unlock()
		slog.Debug("rdmanet: session could not move back to its first path", "session", s.id, "path", first.name, "err", err)
		return
	}
	if c.closing || c.eng.Err() != nil {
		c.stepEndedLocked(sessionMoving)
		c.mu.Unlock()
		l.Close()
		return
	}
	if c.link != link.Link(s.lost) {
		c.eng.Fail(errFailback)
		c.wakeReadyLocked() // suspends: the lost link takes the old one's place
	}
	retired := s.retired
	c.mu.Unlock()
	<-retired

	c.mu.Lock()
	s.failbackWait = 0
	c.mu.Unlock()
	if err := c.attach(l, peer, first.name, 0); err != nil { // moving to active, if it works
		c.mu.Lock()
		c.stepEndedLocked(sessionMoving)
		if c.eng.Err() == nil && !c.closing && c.link == link.Link(s.lost) {
			c.startRecoveryLocked(s.why)
		}
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	s.failbacks++
	c.mu.Unlock()
	slog.Info("rdmanet: session moved back to its first path", "session", s.id, "from", from, "to", first.name)
}
