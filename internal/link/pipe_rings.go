package link

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
	mem  []byte
	addr uint64
	rkey uint32
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
			poison(r.mem)
			e.ringBytes -= len(r.mem)
			e.rings = append(e.rings[:i], e.rings[i+1:]...)
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
		if r.wr.Kind == SendData && r.data == nil {
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

// sendRing is the transmit ring a request names: SendRing, or a stream's.
func (e *Pipe) sendRing(key uint32) ([]byte, bool) {
	if key == 0 {
		return e.send, true
	}
	b, ok := e.streamSends[key]
	return b, ok
}

// NewStreamRings makes a stream's rings (Carrier). They count against
// RingLimit as NewRecvRing's do, and the receive ring is one of the rings
// the peer's writes are checked against.
func (e *Pipe) NewStreamRings(send, recv int) (StreamRings, error) {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return StreamRings{}, closedError("NewStreamRings")
	}
	if send <= 0 || recv <= 0 {
		return StreamRings{}, misuse("NewStreamRings: %d and %d bytes", send, recv)
	}
	if err := e.takeRingBytes(send + recv); err != nil {
		return StreamRings{}, err
	}
	e.ringCount++
	r := pipeRing{mem: make([]byte, recv), addr: e.addr + uint64(e.ringCount)<<24, rkey: rand.Uint32()}
	e.rings = append(e.rings, r)
	if e.streamSends == nil {
		e.streamSends = map[uint32][]byte{}
	}
	e.streamKeys++
	e.streamSends[e.streamKeys] = make([]byte, send)
	e.stats.RingsMade++
	return StreamRings{Send: e.streamSends[e.streamKeys], SendKey: e.streamKeys, Recv: r.mem, RecvAddr: r.addr, RecvKey: r.rkey}, nil
}

// FreeStreamRings gives back a stream's rings and poisons them, so that a
// write that lands after would show.
func (e *Pipe) FreeStreamRings(sr StreamRings) error {
	e.pair.mu.Lock()
	defer e.pair.mu.Unlock()
	if e.closed {
		return closedError("FreeStreamRings")
	}
	send, ok := e.streamSends[sr.SendKey]
	if !ok || !SameRing(send, sr.Send) {
		return misuse("FreeStreamRings: a transmit ring this end did not make")
	}
	for _, r := range e.flight {
		if r.wr.Kind == SendData && r.wr.Ring == sr.SendKey && r.data == nil {
			return misuse("FreeStreamRings with a data request from the ring in flight")
		}
	}
	i := slices.IndexFunc(e.rings, func(r pipeRing) bool { return SameRing(r.mem, sr.Recv) })
	if i < 0 {
		return misuse("FreeStreamRings: a receive ring this end did not make")
	}
	poison(e.rings[i].mem)
	poison(send)
	e.rings = slices.Delete(e.rings, i, i+1)
	delete(e.streamSends, sr.SendKey)
	e.ringBytes -= len(send) + len(sr.Recv)
	e.stats.RingsReleased++
	return nil
}
