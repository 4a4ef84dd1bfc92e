package fallback

import (
	"net/netip"
	"sync"
	"time"
)

// Memory remembers, per destination, why RDMA failed there, so that the
// next dials to it go straight to TCP instead of paying for the attempt
// again (a peer whose host has no RDMA costs a whole attempt timeout). An
// entry lasts TTL; a successful RDMA dial forgets it. Only reasons that
// belong to the destination are remembered (Remembers). The zero value is
// not usable: use NewMemory.
type Memory struct {
	ttl time.Duration
	max int
	now func() time.Time // time.Now; tests replace it

	mu sync.Mutex
	m  map[netip.AddrPort]memoryEntry
}

type memoryEntry struct {
	err     *Error
	expires time.Time
}

// DefaultMemoryTTL is how long rdmanet's dials remember a failure.
const DefaultMemoryTTL = time.Minute

// NewMemory returns a Memory whose entries last ttl and which holds at most
// max destinations (the oldest are dropped first).
func NewMemory(ttl time.Duration, max int) *Memory {
	return &Memory{ttl: ttl, max: max, now: time.Now, m: make(map[netip.AddrPort]memoryEntry)}
}

// Remembers reports whether a failure for this reason is kept: those that
// depend on the destination (its host, its port) and not on this host.
func Remembers(r Reason) bool {
	switch r {
	case ReasonRejected, ReasonTimeout, ReasonUnreachable:
		return true
	}
	return false
}

// Recall returns the remembered failure for dst (marked Remembered), or nil.
func (m *Memory) Recall(dst netip.AddrPort) *Error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[dst]
	if !ok {
		return nil
	}
	if !m.now().Before(e.expires) {
		delete(m.m, dst)
		return nil
	}
	r := *e.err
	r.Remembered = true
	return &r
}

// Remember records e for dst if its reason is one that is remembered.
func (m *Memory) Remember(dst netip.AddrPort, e *Error) {
	if e == nil || !Remembers(e.Reason) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if _, ok := m.m[dst]; !ok && len(m.m) >= m.max {
		m.evict(now)
	}
	m.m[dst] = memoryEntry{err: e, expires: now.Add(m.ttl)}
}

// evict drops expired entries, or, if none has expired, the one that
// expires first; m.mu is held.
func (m *Memory) evict(now time.Time) {
	var oldest netip.AddrPort
	var first time.Time
	for k, e := range m.m {
		if !now.Before(e.expires) {
			delete(m.m, k)
			continue
		}
		if first.IsZero() || e.expires.Before(first) {
			oldest, first = k, e.expires
		}
	}
	if len(m.m) >= m.max {
		delete(m.m, oldest)
	}
}

// Forget drops what is remembered of dst.
func (m *Memory) Forget(dst netip.AddrPort) {
	m.mu.Lock()
	delete(m.m, dst)
	m.mu.Unlock()
}

// Clear forgets every destination.
func (m *Memory) Clear() {
	m.mu.Lock()
	clear(m.m)
	m.mu.Unlock()
}

// Len is how many destinations are remembered (expired ones included until
// they are looked up or evicted).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
