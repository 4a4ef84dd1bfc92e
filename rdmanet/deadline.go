package rdmanet

import (
	"sync"
	"time"
)

// deadline is one direction's deadline: a channel that is closed when the
// deadline passes, replaced when the deadline is moved. A waiter selects on
// expired(), so setting a deadline in the past wakes it at once, as
// net.Conn requires. Setting costs a timer; waiting costs nothing.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{} // closed once the deadline has passed
}

func newDeadline() deadline { return deadline{ch: make(chan struct{})} }

// set moves the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		// The timer already fired and closed ch; waiters after now need a fresh one.
		d.ch = make(chan struct{})
	}
	d.timer = nil
	select {
	case <-d.ch:
		d.ch = make(chan struct{})
	default:
	}
	if t.IsZero() {
		return
	}
	if dur := time.Until(t); dur > 0 {
		ch := d.ch
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	close(d.ch)
}

// expired returns the channel closed when the current deadline passes.
func (d *deadline) expired() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}
