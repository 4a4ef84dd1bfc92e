package fallback

import "sync/atomic"

// Counters count connections by transport and fallbacks by reason. They are
// safe for concurrent use; the zero value is ready.
type Counters struct {
	dialed, accepted [2]atomic.Uint64 // by transportIndex
	fallbacks        [len(reasons)]atomic.Uint64
}

func transportIndex(t Transport) int {
	if t == RDMA {
		return 0
	}
	return 1
}

// Dialed counts a connection made by a dial.
func (c *Counters) Dialed(t Transport) { c.dialed[transportIndex(t)].Add(1) }

// Accepted counts a connection returned by a listener.
func (c *Counters) Accepted(t Transport) { c.accepted[transportIndex(t)].Add(1) }

// FellBack counts a dial or listener that used TCP, or failed, for reason r.
func (c *Counters) FellBack(r Reason) {
	for i, x := range reasons {
		if x == r {
			c.fallbacks[i].Add(1)
			return
		}
	}
}

// Snapshot is a copy of Counters at one moment.
type Snapshot struct {
	Dialed    map[Transport]uint64 // connections made by dials
	Accepted  map[Transport]uint64 // connections returned by Accept
	Fallbacks map[Reason]uint64    // dials and listeners that could not use RDMA, by reason
}

// Snapshot copies the counters.
func (c *Counters) Snapshot() Snapshot {
	s := Snapshot{
		Dialed:    map[Transport]uint64{RDMA: c.dialed[0].Load(), TCP: c.dialed[1].Load()},
		Accepted:  map[Transport]uint64{RDMA: c.accepted[0].Load(), TCP: c.accepted[1].Load()},
		Fallbacks: make(map[Reason]uint64, len(reasons)),
	}
	for i, r := range reasons {
		s.Fallbacks[r] = c.fallbacks[i].Load()
	}
	return s
}
