package rdmanet

import (
	"sync"
	"time"
)

// deadline is one direction's deadline: a channel that is closed when the
// deadline passes, replaced when the deadline is moved. A waiter selects on
// expired(), so setting a deadline in the past wakes it at once, as
// net.Conn requires. Setting costs a timer; waiting costs nothing.
//
// A waiter parked elsewhere (in the netpoller, on the completion channel)
// cannot select on the channel: wake, when set, is called each time the
// deadline passes, after the channel is closed, and must wake it.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{} // closed once the deadline has passed
	wake  func()
}

func newDeadline() deadline { return deadline{ch: make(chan struct{})} }

// set moves the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	// Not under d.mu: wake may take the connection's lock, which is held
	// around expired.
	if d.move(t) && d.wake != nil {
		d.wake()
	}
}

// move moves the deadline and reports whether it has passed.
func (d *deadline) move(t time.Time) (passed bool) {
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
		return false
	}
	if dur := time.Until(t); dur > 0 {
		ch, wake := d.ch, d.wake
		d.timer = time.AfterFunc(dur, func() {
			close(ch)
			if wake != nil {
				wake()
			}
		})
		return false
	}
	close(d.ch)
	return true
}

// expired returns the channel closed when the current deadline passes.
func (d *deadline) expired() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}
