package link

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// Rings that follow traffic, in memory (link.Rings): rings are made on
// demand, up to PipeConfig.RingLimit, each with an address and key of its
// own. A ring given back is poisoned and no longer a target: a write the
// peer makes into it fails the connection (ErrRemoteAccess), and a read
// of it after it was given back reads poison, so a test that checks the
// bytes finds either.

var _ Rings = (*Pipe)(nil)

var _ Carrier = (*Pipe)(nil)

// ErrRingsExhausted is NewRecvRing's and ReplaceSendRing's error past
// PipeConfig.RingLimit.
var ErrRingsExhausted = errors.New("link: memory: ring pool exhausted")

// ringPoison fills memory given back.
const ringPoison = 0xee

type pipeRing struct {
	mem    []byte
	addr   uint64
	rkey   uint32
	shared bool // ShareRecvRing's: another end's memory
}

// NewRecvRing makes a receive ring of size bytes.
func (e *Pipe) NewRecvRing(size int) ([]byte, uint64, uint32, error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return nil, 0, 0, closedError("NewRecvRing")
	}
	if size <= 0 {
		return nil, 0, 0, misuse("NewRecvRing: %d bytes", size)
	}
	if err := e.takeRingBytes(size); err != nil {
		return nil, 0, 0, err
	}
	e.ringCount++
	r := pipeRing{mem: make([]byte, size), addr: e.addr + uint64(e.ringCount)<<24, rkey: rand.Uint32()}
	e.rings = append(e.rings, r)
	e.stats.RingsMade++
	return r.mem, r.addr, r.rkey, nil
}

// ReleaseRecvRing gives back a ring NewRecvRing made, or the first one.
func (e *Pipe) ReleaseRecvRing(mem []byte) error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return closedError("ReleaseRecvRing")
	}
	if len(mem) > 0 && !e.recvGone && len(e.recv) > 0 && SameRing(mem, e.recv) {
		e.recvGone = true
		if e.cfg.RecvMem == nil { // the caller's memory is the caller's
			poison(e.recv)
		}
		e.stats.RingsReleased++
		return nil
	}
	for i, r := range e.rings {
		if SameRing(mem, r.mem) {
			e.rings = append(e.rings[:i], e.rings[i+1:]...)
			if r.shared {
				return nil // the registration only: the memory is its maker's
			}
			poison(r.mem)
			e.ringBytes -= len(r.mem)
			e.stats.RingsReleased++
			return nil
		}
	}
	return misuse("ReleaseRecvRing: a ring of %d bytes this end did not make", len(mem))
}

// ReplaceSendRing replaces the transmit ring; no data request may be in
// flight.
func (e *Pipe) ReplaceSendRing(size int) ([]byte, error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return nil, closedError("ReplaceSendRing")
	}
	if size <= 0 {
		return nil, misuse("ReplaceSendRing: %d bytes", size)
	}
	for _, r := range e.flight {
		if r.wr.Kind == SendData && r.wr.Mem == nil && r.data == nil {
			return nil, misuse("ReplaceSendRing with a data request in flight")
		}
	}
	old := e.send
	owned := e.cfg.SendMem == nil || !SameRing(old, e.cfg.SendMem)
	// The first ring does not count against RingLimit; later ones do.
	if err := e.takeRingBytes(size); err != nil {
		return nil, err
	}
	if owned && e.replacedSend {
		e.ringBytes -= len(old)
	}
	if owned {
		poison(old)
	}
	e.send, e.replacedSend = make([]byte, size), true
	return e.send, nil
}

// poisonRings poisons the rings this end made, as closing a queue pair
// frees its memory (Close): a view that outlived them reads poison.
func (e *Pipe) poisonRings() {
	if e.cfg.SendMem == nil || !SameRing(e.send, e.cfg.SendMem) {
		poison(e.send)
	}
	if e.cfg.RecvMem == nil && !e.recvGone {
		poison(e.recv)
	}
	for _, r := range e.rings {
		if !r.shared {
			poison(r.mem)
		}
	}
}

func (e *Pipe) takeRingBytes(size int) error {
	if e.cfg.RingLimit > 0 && e.ringBytes+size > e.cfg.RingLimit {
		e.stats.RingsRefused++
		return fmt.Errorf("%w: %d bytes held, %d more asked, limit %d", ErrRingsExhausted, e.ringBytes, size, e.cfg.RingLimit)
	}
	e.ringBytes += size
	return nil
}

func poison(b []byte) {
	for i := range b {
		b[i] = ringPoison
	}
}

// dataSrc is where a SendData request's bytes are: a transmit ring, or
// registered memory.
func (e *Pipe) dataSrc(wr *SendWR) ([]byte, bool) {
	if wr.Mem != nil {
		return wr.Mem.Bytes(), true
	}
	return e.sendRing(wr.Ring)
}

// registerLocked registers m with this end, unless it is already: a
// device's link registers memory at its first request from it.
func (e *Pipe) registerLocked(m *Mem) error {
	if e.failRegisterMem {
		return ErrRingsExhausted
	}
	return m.Register(e, func() (func(), error) { return func() {}, nil })
}

// RegisterMem registers m with this end (MemSender); it fails with
// ErrRingsExhausted once FailRegisterMem was set.
func (e *Pipe) RegisterMem(m *Mem) error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return closedError("RegisterMem")
	}
	return e.registerLocked(m)
}

// sendRing is the transmit ring a request names: SendRing, or a stream's.
func (e *Pipe) sendRing(key uint32) ([]byte, bool) {
	if key == 0 {
		return e.send, true
	}
	b, ok := e.streamSends[key]
	return b, ok
}

// NewSendRing makes a stream's transmit ring (Carrier); it counts
// against RingLimit as NewRecvRing's rings do.
func (e *Pipe) NewSendRing(size int) ([]byte, uint32, error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return nil, 0, closedError("NewSendRing")
	}
	if size <= 0 {
		return nil, 0, misuse("NewSendRing: %d bytes", size)
	}
	if err := e.takeRingBytes(size); err != nil {
		return nil, 0, err
	}
	if e.streamSends == nil {
		e.streamSends = map[uint32][]byte{}
	}
	e.streamKeys++
	mem := make([]byte, size)
	e.streamSends[e.streamKeys] = mem
	return mem, e.streamKeys, nil
}

// ReleaseSendRing gives back and poisons a transmit ring of NewSendRing's.
func (e *Pipe) ReleaseSendRing(key uint32) error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return closedError("ReleaseSendRing")
	}
	mem, ok := e.streamSends[key]
	if !ok {
		return misuse("ReleaseSendRing: no transmit ring %d", key)
	}
	for _, r := range e.flight {
		if r.wr.Kind == SendData && r.wr.Ring == key && r.wr.Mem == nil && r.data == nil {
			return misuse("ReleaseSendRing with a data request from the ring in flight")
		}
	}
	delete(e.streamSends, key)
	if e.sharedSends[key] {
		delete(e.sharedSends, key)
		return nil // the registration only
	}
	poison(mem)
	e.ringBytes -= len(mem)
	return nil
}

// ShareRecvRing makes a ring another end made a target of the peer's
// writes here, with an address and key of this end's (Carrier).
func (e *Pipe) ShareRecvRing(_ Carrier, mem []byte) (uint64, uint32, error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return 0, 0, closedError("ShareRecvRing")
	}
	if len(mem) == 0 {
		return 0, 0, misuse("ShareRecvRing: no memory")
	}
	for _, r := range e.rings {
		if SameRing(mem, r.mem) {
			return 0, 0, misuse("ShareRecvRing: a ring already registered here")
		}
	}
	e.ringCount++
	r := pipeRing{mem: mem, addr: e.addr + uint64(e.ringCount)<<24, rkey: rand.Uint32(), shared: true}
	e.rings = append(e.rings, r)
	return r.addr, r.rkey, nil
}

// ShareSendRing names a transmit ring another end made by a key of this
// end's (Carrier).
func (e *Pipe) ShareSendRing(_ Carrier, mem []byte) (uint32, error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return 0, closedError("ShareSendRing")
	}
	if len(mem) == 0 {
		return 0, misuse("ShareSendRing: no memory")
	}
	if e.streamSends == nil {
		e.streamSends = map[uint32][]byte{}
	}
	if e.sharedSends == nil {
		e.sharedSends = map[uint32]bool{}
	}
	e.streamKeys++
	e.streamSends[e.streamKeys] = mem
	e.sharedSends[e.streamKeys] = true
	return e.streamKeys, nil
}
