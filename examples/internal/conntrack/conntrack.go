// Package conntrack keeps what a server must close when it closes: the
// listeners it serves, the connections it has accepted and the goroutines
// that serve them. The example servers (kvserver, nbd) share it, so that
// they close the same way: no listener or connection is left open, and
// Close returns only once nothing of the server runs any more.
package conntrack

import (
	"errors"
	"net"
	"sync"
)

// Tracker holds a server's listeners, its live connections and the
// goroutines that Close waits for. Once closed it takes none of them again,
// so that a connection accepted while the server closes is not served
// after Close has returned. The zero value is ready to use; a Tracker must
// not be copied after first use.
type Tracker struct {
	mu        sync.Mutex
	closed    bool
	done      chan struct{} // closed by Close; made on first use
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup // tracked connections and goroutines of Go
}

// AddListener registers l, which Close then closes, unless the tracker is
// closed. It reports whether l was registered; a server's Serve returns at
// once when it was not.
func (t *Tracker) AddListener(l net.Listener) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if t.listeners == nil {
		t.listeners = make(map[net.Listener]struct{})
	}
	t.listeners[l] = struct{}{}
	return true
}

// RemoveListener forgets l, once Serve no longer accepts on it. It does not
// close l.
func (t *Tracker) RemoveListener(l net.Listener) {
	t.mu.Lock()
	delete(t.listeners, l)
	t.mu.Unlock()
}

// Track registers an accepted connection, unless the tracker is closed, and
// counts its goroutine as one Close waits for. It reports whether c was
// registered; if not, the caller closes c and does not serve it. Each
// connection Track registers must be given to Untrack once, when its
// goroutine is done with it.
func (t *Tracker) Track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if t.conns == nil {
		t.conns = make(map[net.Conn]struct{})
	}
	t.conns[c] = struct{}{}
	t.wg.Add(1)
	return true
}

// Untrack closes c, forgets it, and counts its goroutine as finished: the
// last thing a connection's goroutine does.
func (t *Tracker) Untrack(c net.Conn) {
	c.Close()
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	t.wg.Done()
}

// Go runs f in a goroutine that Close waits for, unless the tracker is
// closed; it reports whether f was started. f should return soon after
// Done is closed.
func (t *Tracker) Go(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

// Closed reports whether Close has been called. A server's Serve uses it to
// tell an Accept that failed because Close closed the listener from one
// that failed on its own.
func (t *Tracker) Closed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// Done returns a channel that Close closes, before it closes anything else,
// for goroutines that wait for something other than a connection (a timer,
// a pause before Accept is tried again) to stop on.
func (t *Tracker) Done() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		t.done = make(chan struct{})
	}
	return t.done
}

// NumConns returns how many connections are registered.
func (t *Tracker) NumConns() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// Close closes Done, then every listener, then every connection (so that
// their goroutines' reads and writes fail), and returns once the goroutines
// of the connections and of Go have finished. It returns the first error of
// closing a listener other than net.ErrClosed: a listener that Serve has
// closed already is no error. A second Close waits in the same way and
// returns nil.
func (t *Tracker) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.wg.Wait()
		return nil
	}
	t.closed = true
	if t.done == nil {
		t.done = make(chan struct{})
	}
	close(t.done)
	var err error
	for l := range t.listeners {
		if e := l.Close(); e != nil && err == nil && !errors.Is(e, net.ErrClosed) {
			err = e
		}
	}
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}
