package connfd

import (
	"sync"
	"time"
)

// Deadline is one direction's deadline: a channel that is closed when the
// deadline passes, replaced when the deadline is moved. A waiter selects on
// Expired, so setting a deadline in the past wakes it at once, as net.Conn
// requires. Setting costs a timer; waiting costs nothing.
//
// A waiter parked elsewhere (in the netpoller, on a completion channel)
// cannot select on the channel: the wake function given to Init is called
// each time the deadline passes, after the channel is closed, and must
// wake it.
type Deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{} // closed once the deadline has passed
	wake  func()
}

// Init makes d a deadline that has not passed, with wake (or nil) to call
// when it passes.
func (d *Deadline) Init(wake func()) {
	d.ch = make(chan struct{})
	d.wake = wake
}

// Set moves the deadline; the zero time means none.
func (d *Deadline) Set(t time.Time) {
	// Not under d.mu: wake may take the connection's lock, which is held
	// around Expired.
	if d.move(t) && d.wake != nil {
		d.wake()
	}
}

// move moves the deadline and reports whether it has passed.
func (d *Deadline) move(t time.Time) (passed bool) {
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

// Expired returns the channel closed when the current deadline passes.
func (d *Deadline) Expired() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

// Passed reports whether the current deadline has passed.
func (d *Deadline) Passed() bool {
	select {
	case <-d.Expired():
		return true
	default:
		return false
	}
}
