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
// runs after Close has waited for every call in flight and for the engine
// goroutine, so it is the link's only user: what it polls cannot race with
// anyone, and nobody touches the memory it frees.
func (c *Conn) linger() {
	defer close(c.released)
	c.mu.Lock()
	c.eng.Drain()
	c.eng.Flush(c.link)
	c.mu.Unlock()
	timeout := time.AfterFunc(lingerTimeout, c.link.Wake)
	defer timeout.Stop()
	end := time.Now().Add(lingerTimeout)
	cs := c.poll.batch[:]
	for {
		c.mu.Lock()
		drained := c.eng.Drained()
		c.mu.Unlock()
		if drained || !time.Now().Before(end) {
			break
		}
		if c.drainSweep(cs) {
			continue
		}
		if err := c.link.Arm(); err != nil {
			break
		}
		if c.drainSweep(cs) {
			continue
		}
		if err := c.link.Wait(); err != nil && err != link.ErrWoken {
			break
		}
	}
	c.link.Disconnect()
	c.link.Close()
	if c.sess != nil {
		c.sess.end(c)
	}
	c.mem.close()
}

// drainSweep takes one batch of completions while lingering.
func (c *Conn) drainSweep(cs []link.Completion) bool {
	n, err := c.link.Poll(cs)
	if err != nil || n == 0 {
		return false
	}
	c.mu.Lock()
	c.handleLocked(cs[:n])
	c.mu.Unlock()
	return true
}
