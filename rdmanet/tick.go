package rdmanet

import (
	"time"

	"github.com/rdmanet/sdk/internal/link"
)

// Keepalive and dead paths. The engine knows when it next has something to
// check (stream.Engine.NextTick: a keepalive due on an idle connection, or
// the moment outstanding requests count as a dead path); one timer per
// connection fires then. The wanted time only moves later as the
// connection posts and completes, so the timer is never reset on the data
// path: when it fires early, tick finds nothing due and sets it again.

// startTicksLocked arms the timer for the engine's first check; c.mu is held.
func (c *Conn) startTicksLocked() {
	c.ticker = time.AfterFunc(time.Hour, c.tick)
	c.ticker.Stop()
	c.rearmLocked()
}

// rearmLocked sets the timer to the engine's next check, if it has one;
// c.mu is held.
func (c *Conn) rearmLocked() {
	if next := c.eng.NextTick(); !next.IsZero() && !c.closing {
		c.ticker.Reset(time.Until(next))
	}
}

// tick runs the engine's checks: a keepalive goes out, or a dead path
// fails the connection and wakes its waiters.
func (c *Conn) tick() {
	if !c.fd.Incref() {
		return
	}
	defer c.fd.Decref()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return
	}
	c.pathProgressLocked()
	c.eng.Tick()
	c.flushLocked()
	c.rearmLocked()
}

// pathProgressLocked tells the engine how the link's path progresses
// (other connections' completions on the same device and peer), where the
// link knows: a connection queued behind them is late, not dead.
func (c *Conn) pathProgressLocked() {
	if w, ok := c.link.(link.PathWatcher); ok {
		c.eng.PathProgress(w.PathProgress())
	}
}
