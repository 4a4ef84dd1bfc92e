package link

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Device is an in-memory RDMA device: what a real one shares among its
// links, for host tests of many connections at once (rdmalink's device
// context, internal/rdmalink/cqshare.go and compshare.go).
//
// Ends made on a device (PipeConfig.Device) complete on its one
// completion queue of Capacity entries: every completion an end holds and
// has not Polled counts against it. One more overruns the queue, which
// fails every link on the device at once with a completion matching
// ErrOverrun (and ErrDown: another path may work), as a real device's
// CQ_ERR does; the device takes no completion after that. Notify
// functions are called from the device's one goroutine (which runs only
// while it has calls to make), in the order the completions came across
// links, never from the goroutine that posted.
type Device struct {
	capacity int64
	held     atomic.Int64 // completions queued at the device's ends and not Polled

	mu       sync.Mutex
	ends     map[*Pipe]struct{}
	overrun  bool
	calls    []func() // notify calls to make, in order
	running  bool     // the goroutine that makes them runs
	notifies int      // calls made, ever (DeviceStats)
}

// ErrOverrun is matched by the Err of the Failed completion of every link
// on a Device whose completion queue overran.
var ErrOverrun = errors.New("link: memory: the device's completion queue overran")

// NewDevice returns a device whose completion queue has capacity entries.
func NewDevice(capacity int) *Device {
	if capacity <= 0 {
		panic(fmt.Sprintf("link: NewDevice(%d)", capacity))
	}
	return &Device{capacity: int64(capacity), ends: make(map[*Pipe]struct{})}
}

// DeviceStats is what a device saw.
type DeviceStats struct {
	Ends     int  // ends open on it
	Held     int  // completions queued and not Polled
	Overrun  bool // its completion queue overran
	Notifies int  // notify calls made from its goroutine
}

// Stats reports what the device saw.
func (d *Device) Stats() DeviceStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return DeviceStats{Ends: len(d.ends), Held: int(d.held.Load()), Overrun: d.overrun, Notifies: d.notifies}
}

// add registers an end made on the device; on a device whose queue
// overran, the end fails at once.
func (d *Device) add(e *Pipe) {
	d.mu.Lock()
	d.ends[e] = struct{}{}
	over := d.overrun
	d.mu.Unlock()
	if over {
		go d.failAll([]*Pipe{e})
	}
}

// Overrun makes the device's completion queue overrun now, as if a
// completion had not fit (a fault to inject, as Pipe.Cut is).
func (d *Device) Overrun() {
	d.fail()
}

// remove forgets a closed end and what it held.
func (d *Device) remove(e *Pipe, held int) {
	d.held.Add(-int64(held))
	d.mu.Lock()
	delete(d.ends, e)
	d.mu.Unlock()
}

// queued counts a completion queued at one of the device's ends; the one
// that does not fit overruns the queue. Called with the end's pair locked:
// the links are failed from another goroutine, which takes each pair's
// lock in turn.
func (d *Device) queued() {
	if d.held.Add(1) > d.capacity {
		d.fail()
	}
}

// fail marks the queue overrun and fails every link on the device, from
// another goroutine (the caller may hold a pair's lock), once.
func (d *Device) fail() {
	d.mu.Lock()
	first := !d.overrun
	d.overrun = true
	ends := make([]*Pipe, 0, len(d.ends))
	for e := range d.ends {
		ends = append(ends, e)
	}
	d.mu.Unlock()
	if first {
		go d.failAll(ends)
	}
}

// failAll ends every link on the device after an overrun.
func (d *Device) failAll(ends []*Pipe) {
	for _, e := range ends {
		e.pair.mu.Lock()
		if !e.closed && !e.pair.over {
			err := fmt.Errorf("%w (%w)", ErrOverrun, ErrDown)
			e.pair.shut(e, Completion{Kind: Failed, Err: err},
				Completion{Kind: Failed, Err: fmt.Errorf("link: memory: connection failed at the peer: %w", err)})
		}
		e.pair.mu.Unlock()
	}
}

// taken counts completions an end Polled.
func (d *Device) taken(n int) { d.held.Add(-int64(n)) }

// call makes f be called from the device's goroutine, after the calls
// before it.
func (d *Device) call(f func()) {
	d.mu.Lock()
	d.calls = append(d.calls, f)
	start := !d.running
	d.running = true
	d.mu.Unlock()
	if start {
		go d.run()
	}
}

// run makes the calls queued, and ends when there are none.
func (d *Device) run() {
	for {
		d.mu.Lock()
		if len(d.calls) == 0 {
			d.running = false
			d.calls = nil
			d.mu.Unlock()
			return
		}
		f := d.calls[0]
		d.calls = d.calls[1:]
		d.notifies++
		d.mu.Unlock()
		f()
	}
}
