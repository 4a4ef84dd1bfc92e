package rdmanet

import "sync"

// lifetime counts the calls in flight on a connection (Read, Write,
// CloseWrite, a keepalive tick) against Close, as internal/poll's fdMutex
// does for a file descriptor: once Close has begun no call may start, and
// closeAndWait returns when the ones that started have returned. Only then
// may the link, and the registered memory those calls copy into and out
// of, be handed on to be freed.
type lifetime struct {
	mu      sync.Mutex
	n       int           // calls in flight
	closing bool          // closeAndWait has begun
	idle    chan struct{} // closed when n reaches 0 after closing
}

func (l *lifetime) init() { l.idle = make(chan struct{}) }

// acquire registers a call; false after Close began.
func (l *lifetime) acquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing {
		return false
	}
	l.n++
	return true
}

// release ends a call that acquire registered.
func (l *lifetime) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.n == 0 && l.closing {
		close(l.idle)
	}
}

// closeAndWait refuses new calls and waits for those in flight; the caller
// has woken them.
func (l *lifetime) closeAndWait() {
	l.mu.Lock()
	l.closing = true
	if l.n == 0 {
		close(l.idle)
	}
	l.mu.Unlock()
	<-l.idle
}
