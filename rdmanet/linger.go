package rdmanet

import "time"

// lingerTimeout bounds how long a closed connection keeps delivering what
// was written before it disconnects.
const lingerTimeout = 5 * time.Second

// linger delivers what was written before Close, for up to lingerTimeout,
// then disconnects and releases the link and its registered memory. It
// runs after Close has waited for every call in flight (a service among
// them) and made kicks start none, so it is the link's only user: what it
// polls cannot race with anyone, and nobody touches the memory it frees.
//
// A resumable session's path may fail while it lingers: the session then
// resumes, within the same bound, and delivers the rest over the new path
// (internal/session).
func (c *Conn) linger() {
	defer close(c.released)
	c.mu.Lock()
	c.eng.Drain()
	c.eng.Flush(c.link)
	c.mu.Unlock()
	c.fd.Linger(lingerTimeout)
	c.link.Disconnect() // a session's: a resume that comes now is refused
	// Views and a write buffer keep the rings mapped until released.
	c.mu.Lock()
	var gone chan struct{}
	if c.eng.HoldsMemory() {
		gone = make(chan struct{})
		c.viewsGone = gone
	}
	c.mu.Unlock()
	if gone != nil {
		<-gone
	}
	c.link.Close()
	c.mu.Lock()
	c.eng.DropMems() // the link that read registered memory is gone
	c.mu.Unlock()
	c.mem.close()
}
