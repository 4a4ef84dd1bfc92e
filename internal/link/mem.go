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
// registers it with its device on first use, in its domain (RegisterAsync:
// in the background, while the caller copies), and keeps the registration
// until the memory closes or the domain ends: a buffer is registered once,
// not once per send.
type Mem struct {
	b     []byte
	owner any // what b is memory of, for a link that must know (a verbs.Buffer)

	mu      sync.Mutex
	closed  bool
	domains map[any]*memReg // its registrations, made or being made, by domain
	busy    int             // requests that may still read it
	kept    atomic.Uint64   // bytes copied into a transmit ring after they were sent (Kept)
	idle    chan struct{}   // closed when busy falls to 0, while someone waits
}

// memReg is a Mem's registration in one domain: being made until ready
// closes, then made (drop) or refused (err).
type memReg struct {
	ready chan struct{}
	drop  func()
	err   error
}

// ErrMemClosed is Register's error for a Mem that closed.
var ErrMemClosed = errors.New("rdmanet: registered memory is closed")

// ErrMemRegistering is RegisterAsync's answer while the registration is
// being made: the caller copies meanwhile.
var ErrMemRegistering = errors.New("rdmanet: registered memory: its registration is being made")

// MemSender is a link that sends from registered memory (SendWR.Mem).
// RegisterMem reports whether m may be sent from on the link's device: nil
// once it is registered there; ErrMemRegistering while the registration is
// made (pinning a large buffer takes long, and nothing waits for it); any
// other error (pinning failed, the device refused) for good. Until nil,
// the caller copies instead. Called under the same rule as PostSend.
type MemSender interface {
	RegisterMem(m *Mem) error
}

// NewMem makes a Mem of b, memory of owner (a verbs.Buffer, which an RDMA
// link registers), which must not move or be freed until Close returns.
func NewMem(b []byte, owner any) *Mem { return &Mem{b: b, owner: owner, domains: map[any]*memReg{}} }

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
// the registration, unless m is registered there already, and waits for a
// registration being made there. A refused registration is not tried
// again in the domain (it would be refused again, after pinning what it
// could: the domain ends with the links that share it).
func (m *Mem) Register(domain any, reg func() (drop func(), err error)) error {
	r, start, err := m.regFor(domain)
	if err != nil {
		return err
	}
	if start {
		m.run(r, reg)
	}
	<-r.ready
	return r.err
}

// RegisterAsync is Register that does not wait: it hands the
// registration's making to start (which runs it on a goroutine of its
// own, and may hold the domain meanwhile) and returns ErrMemRegistering
// until it is made. The memory's lock is not held while it is made, so
// the requests of other connections that send from m go on.
func (m *Mem) RegisterAsync(domain any, reg func() (drop func(), err error), start func(run func())) error {
	r, begin, err := m.regFor(domain)
	if err != nil {
		return err
	}
	if begin {
		start(func() { m.run(r, reg) })
	}
	select {
	case <-r.ready:
		return r.err
	default:
		return ErrMemRegistering
	}
}

// regFor is m's registration in domain, and whether the caller makes it
// (it was not being made).
func (m *Mem) regFor(domain any) (r *memReg, start bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, false, ErrMemClosed
	}
	if r = m.domains[domain]; r != nil {
		return r, false, nil
	}
	r = &memReg{ready: make(chan struct{})}
	m.domains[domain] = r
	return r, true, nil
}

// run makes r with reg. A registration made after m closed is dropped
// here, as Close did not see it made, before r is ready: Close, which
// waits for that, returns with nothing of m registered.
func (m *Mem) run(r *memReg, reg func() (func(), error)) {
	drop, err := reg()
	m.mu.Lock()
	closed := m.closed
	if !closed {
		r.drop, r.err = drop, err
	}
	m.mu.Unlock()
	if closed {
		if err == nil {
			drop()
		}
		r.err = ErrMemClosed
	}
	close(r.ready)
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
// first waits for Idle. A registration still being made is waited for
// (the memory must stay mapped under it), and dropped as it is made (run).
func (m *Mem) Close() {
	m.mu.Lock()
	regs := m.domains
	m.domains, m.closed = nil, true
	m.mu.Unlock()
	for _, r := range regs {
		<-r.ready
		if r.drop != nil {
			r.drop()
		}
	}
}

// Kept counts n bytes sent from m that a connection copied into its
// transmit ring afterwards, to send them again from there if it must.
func (m *Mem) Kept(n int) { m.kept.Add(uint64(n)) }

// KeptBytes is how many bytes Kept counted.
func (m *Mem) KeptBytes() uint64 { return m.kept.Load() }
