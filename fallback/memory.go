package fallback

import (
	"net/netip"
	"sync"
	"time"
)

// Memory remembers, per destination, why RDMA failed there, so that the
// next dials to it go straight to TCP instead of paying for the attempt
// again (a peer whose host has no RDMA costs a whole attempt timeout). An
// entry lasts TTL; a successful RDMA dial forgets it. Only failures that
// belong to the destination are remembered (Remembers), and not those of a
// peer that answers RDMA but was busy (Error.PeerAnswers).
//
// It also remembers which hosts answered over RDMA (Answered), so that a
// dial that times out toward one of them can tell a busy peer from a host
// without RDMA (Answers). That is the host's, not the port's: a host with
// RDMA answers a request to a port nobody listens on at once, with a
// reject, so silence from a host that answered on any port means it is
// busy (or a packet was lost), not that it has no RDMA. The zero value is
// not usable: use NewMemory.
type Memory struct {
	ttl time.Duration
	max int
	now func() time.Time // time.Now; tests replace it

	mu       sync.Mutex
	m        map[netip.AddrPort]memoryEntry
	answered map[netip.Addr]time.Time // when each host's answer stops counting
}

type memoryEntry struct {
	err     *Error
	expires time.Time
}

// DefaultMemoryTTL is how long rdmanet's dials remember a failure.
const DefaultMemoryTTL = time.Minute

// NewMemory returns a Memory whose entries last ttl and which holds at most
// max destinations that failed and max hosts that answered (the oldest are
// dropped first).
func NewMemory(ttl time.Duration, max int) *Memory {
	return &Memory{ttl: ttl, max: max, now: time.Now,
		m: make(map[netip.AddrPort]memoryEntry), answered: make(map[netip.Addr]time.Time)}
}

// Remembers reports whether a failure for this reason is kept: those that
// depend on the destination (its host, its port) and not on this host.
func Remembers(r Reason) bool {
	switch r {
	case ReasonRejected, ReasonTimeout, ReasonUnreachable, ReasonNoImmediate:
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

// Remember records e for dst if its reason is one that is remembered and
// it does not come from a peer that answers RDMA (a busy peer is busy for a
// moment; the next dial should try RDMA again).
func (m *Memory) Remember(dst netip.AddrPort, e *Error) {
	if e == nil || !Remembers(e.Reason) || e.PeerAnswers {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if _, ok := m.m[dst]; !ok && len(m.m) >= m.max {
		evict(m.m, m.max, now, func(e memoryEntry) time.Time { return e.expires })
	}
	m.m[dst] = memoryEntry{err: e, expires: now.Add(m.ttl)}
}

// Answered records that dst answered over RDMA: a connection was made, or
// the peer answered a request (a reject too) after the dial had stopped
// waiting. What was remembered of dst is forgotten (the answer contradicts
// it), and for TTL Answers is true of every port of dst's host.
func (m *Memory) Answered(dst netip.AddrPort) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, dst)
	now := m.now()
	host := dst.Addr()
	if _, ok := m.answered[host]; !ok && len(m.answered) >= m.max {
		evict(m.answered, m.max, now, func(t time.Time) time.Time { return t })
	}
	m.answered[host] = now.Add(m.ttl)
}

// Answers reports whether dst's host answered over RDMA within TTL, on any
// port: a timeout toward dst then means a busy peer, not a host without
// RDMA.
func (m *Memory) Answers(dst netip.AddrPort) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	host := dst.Addr()
	until, ok := m.answered[host]
	if ok && !m.now().Before(until) {
		delete(m.answered, host)
		return false
	}
	return ok
}

// ForgetAnswer drops the answer recorded for dst's host: it left a request
// unanswered for so long that it no longer counts as a busy peer.
func (m *Memory) ForgetAnswer(dst netip.AddrPort) {
	m.mu.Lock()
	delete(m.answered, dst.Addr())
	m.mu.Unlock()
}

// evict makes room in m, which holds max entries: it drops the expired
// ones, or, if none has expired, the one that expires first. The Memory's
// mutex is held.
func evict[K comparable, V any](m map[K]V, max int, now time.Time, expires func(V) time.Time) {
	var oldest K
	var first time.Time
	for k, v := range m {
		e := expires(v)
		if !now.Before(e) {
			delete(m, k)
			continue
		}
		if first.IsZero() || e.Before(first) {
			oldest, first = k, e
		}
	}
	if len(m) >= max {
		delete(m, oldest)
	}
}

// Forget drops the failure remembered for dst.
func (m *Memory) Forget(dst netip.AddrPort) {
	m.mu.Lock()
	delete(m.m, dst)
	m.mu.Unlock()
}

// Clear forgets every destination: its failures and its answers.
func (m *Memory) Clear() {
	m.mu.Lock()
	clear(m.m)
	clear(m.answered)
	m.mu.Unlock()
}

// Len is how many destinations' failures are remembered (expired ones
// included until they are looked up or evicted).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
