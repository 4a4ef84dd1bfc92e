package link

import (
	"errors"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Mem is memory an application registered to send from (rdmanet.Memory):
// a SendData request with Mem set sends Mem's bytes [Off, Off+N) from where
// they are, not from the transmit ring. A link that can (a MemSender)
// registers it with its device on first use, in its domain, and keeps the
// registration until the memory closes or the domain ends: a buffer is
// registered once, not once per send.
type Mem struct {
	b     []byte
	owner any // what b is memory of, for a link that must know (a verbs.Buffer)

	mu      sync.Mutex
	closed  bool
	domains map[any]func() // registered in these domains, and how to drop each
	busy    int            // requests that may still read it
	kept    atomic.Uint64  // bytes copied into a transmit ring after they were sent (Kept)
	idle    chan struct{}  // closed when busy falls to 0, while someone waits
}

// ErrMemClosed is Register's error for a Mem that closed.
var ErrMemClosed = errors.New("rdmanet: registered memory is closed")

// MemSender is a link that sends from registered memory (SendWR.Mem).
// RegisterMem registers m with the link's device, unless it is already,
// before the first request that sends from it; an error (pinning failed,
// the device refused) leaves the caller to copy instead. Called under the
// same rule as PostSend.
type MemSender interface {
	RegisterMem(m *Mem) error
}

// NewMem makes a Mem of b, memory of owner (a verbs.Buffer, which an RDMA
// link registers), which must not move or be freed until Close returns.
func NewMem(b []byte, owner any) *Mem { return &Mem{b: b, owner: owner, domains: map[any]func(){}} }

// Bytes is the memory.
func (m *Mem) Bytes() []byte { return m.b }

// Owner is what the memory is memory of (NewMem).
func (m *Mem) Owner() any { return m.owner }

// OffsetOf returns where b lies in m, and whether it lies wholly in it.
func (m *Mem) OffsetOf(b []byte) (int, bool) {
	if len(b) == 0 || len(m.b) == 0 {
		return 0, len(b) == 0
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(m.b)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < start || p+uintptr(len(b)) > start+uintptr(len(m.b)) {
		return 0, false
	}
	return int(p - start), true
}

// Register runs reg, which registers m in domain and returns how to drop
// the registration, unless m is registered there already. A link calls it
// from RegisterMem, with its device's protection domain as domain.
func (m *Mem) Register(domain any, reg func() (drop func(), err error)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrMemClosed
	}
	if _, ok := m.domains[domain]; ok {
		return nil
	}
	drop, err := reg()
	if err != nil {
		return err
	}
	m.domains[domain] = drop
	return nil
}

// Forget drops m's registration in domain, which ends: the domain drops
// it (its drop function is not called).
func (m *Mem) Forget(domain any) {
	m.mu.Lock()
	delete(m.domains, domain)
	m.mu.Unlock()
}

// Hold counts a request that may read m until Done.
func (m *Mem) Hold() {
	m.mu.Lock()
	m.busy++
	m.mu.Unlock()
}

// Done ends a Hold: the request completed, its link closed, or its bytes
// were copied where it is sent again from.
func (m *Mem) Done() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy--
	if m.busy == 0 && m.idle != nil {
		close(m.idle)
		m.idle = nil
	}
}

// Busy is how many requests may still read m.
func (m *Mem) Busy() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.busy
}

// Idle returns a channel closed once no request may read m (at once, if
// none may now).
func (m *Mem) Idle() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.busy == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if m.idle == nil {
		m.idle = make(chan struct{})
	}
	return m.idle
}

// Close drops every registration of m; later Registers fail. The caller
// first waits for Idle.
func (m *Mem) Close() {
	m.mu.Lock()
	drops := m.domains
	m.domains, m.closed = nil, true
	m.mu.Unlock()
	for _, drop := range drops {
		drop()
	}
}

// Kept counts n bytes sent from m that a connection copied into its
// transmit ring afterwards, to send them again from there if it must.
func (m *Mem) Kept(n int) { m.kept.Add(uint64(n)) }

// KeptBytes is how many bytes Kept counted.
func (m *Mem) KeptBytes() uint64 { return m.kept.Load() }
