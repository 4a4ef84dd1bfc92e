// Package guard serialises an object's use against its Close, so that a handle
// that rdma-core has destroyed is never passed to C again: operations hold the
// read side, Close the write side.
package guard

import "sync"

// Guard is embedded in objects that wrap rdma-core handles.
type Guard struct {
	mu     sync.RWMutex
	closed bool
}

// Use locks for one operation and reports whether the object is open; when it
// is closed nothing stays locked. Call Done after a successful Use.
func (g *Guard) Use() bool {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return false
	}
	return true
}

// Done ends an operation begun with Use.
func (g *Guard) Done() { g.mu.RUnlock() }

// Close runs destroy once, after every operation in progress has finished;
// later calls return nil. When destroy fails the object stays open, so the
// caller can retry once the cause (say EBUSY) is gone.
func (g *Guard) Close(destroy func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	if err := destroy(); err != nil {
		return err
	}
	g.closed = true
	return nil
}

// Lock and Unlock hold the object against operations and Close, for state
// that lives beside the handle.
func (g *Guard) Lock()   { g.mu.Lock() }
func (g *Guard) Unlock() { g.mu.Unlock() }

// Closed reports whether Close has run; call it with Lock held.
func (g *Guard) Closed() bool { return g.closed }
