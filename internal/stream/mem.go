package stream

import (
	"errors"

	"github.com/rdmanet/sdk/internal/link"
)

// Sending from registered memory (issue 26, "large transfers";
// docs/engine.md, "Zero-copy"): WriteMem posts bytes of the application's
// registered memory (link.Mem) from where they are, straight into the
// peer's ring. The wire does not change: the peer sees the same writes as
// from the transmit ring.
//
// The bytes take their place in the transmit ring's accounting as copied
// bytes do (positions are the stream's running totals), but the ring's
// memory at those positions is left unused. So the send queue, the
// signalling policy, the peer's window and a session's acknowledgements
// work unchanged, and the memory in flight is bounded by the ring. The
// memory is held (memSeg) until the request's completion; in a resumable
// stream, whose ring keeps bytes until the peer acknowledges them, those
// not yet acknowledged are copied into the ring then (releaseMems). Where
// the ring must hold them earlier (a new link sends them again from it,
// or a grown ring keeps them) they are copied there first (placeMems).

// ErrNotInMemory is WriteMem's error for bytes that do not lie in the
// registered memory named.
var ErrNotInMemory = errors.New("rdmanet: bytes not in the registered memory")

// memSeg is a range of the stream sent from registered memory, held until
// its requests complete (releaseMems).
type memSeg struct {
	start, end uint64 // stream positions
	m          *link.Mem
	off        int // where start's byte is in m
}

// WriteMem sends b, which lies in m, from where it is; m must be
// registered with the link (link.MemSender). It returns as Write does,
// with how many bytes were posted; the memory stays in use until
// MemHeld reports false.
func (e *Engine) WriteMem(m *link.Mem, b []byte) (int, error) {
	e.reserveWant, e.memWant = 0, false
	off, ok := m.OffsetOf(b)
	switch {
	case e.reserved != nil && len(b) > 0:
		return 0, ErrBufferHeld
	case !ok:
		return 0, ErrNotInMemory
	}
	e.sendLarge(len(b))
	written := 0
	for {
		if stop, err := e.writeStops(written, len(b), true); stop {
			return written, err
		}
		// Bytes held from Writes go first, in a request of their own.
		e.postHeld(false)
		room := e.send.Room()
		_, space := e.sq.RingSpace()
		if e.sq.Held() > 0 || room == 0 || space == 0 || !e.rc.canData() {
			if room > 0 && space == 0 && e.sq.SlotsFree() > 0 {
				e.sendFull()
			}
			return written, ErrWouldBlock
		}
		n := min(uint64(len(b)-written), uint64(room), space)
		remote, rkey, _ := e.send.Take(uint32(n))
		e.rc.spend()
		start := e.sq.put
		// The last request of b is signaled: its completion frees the
		// memory.
		id, signaled := e.sq.postData(n, written+int(n) == len(b))
		e.out = append(e.out, link.SendWR{
			Kind: link.SendData, Signaled: signaled, ID: id,
			Mem: m, Off: uint32(off + written), N: uint32(n), Remote: remote, RKey: rkey,
		})
		e.posted(signaled)
		e.arrived = false
		e.holdMem(m, start, e.sq.put, off+written)
		written += int(n)
	}
}

// holdMem records stream bytes [start, end) sent from m at off.
func (e *Engine) holdMem(m *link.Mem, start, end uint64, off int) {
	if k := len(e.mems); k > 0 {
		if s := &e.mems[k-1]; s.m == m && s.end == start && s.off+int(s.end-s.start) == off {
			s.end = end
			return
		}
	}
	m.Hold()
	e.mems = append(e.mems, memSeg{start: start, end: end, m: m, off: off})
}

// MemHeld reports whether bytes sent from registered memory are still in
// use: a request that reads them has not completed.
func (e *Engine) MemHeld() bool { return len(e.mems) > 0 }

// WaitMem makes Writable wait for MemHeld to turn false. The ranges the
// completions taken so far free are given back already (AfterCompletions).
func (e *Engine) WaitMem() { e.memWant = true }

// releaseMems gives back the memory of every range the ring would have
// freed now. In a resumable stream, bytes whose requests completed also
// wait for the peer's acknowledgement, which comes as its reader frees a
// quarter of its ring: a writer that waited for it could wait for a
// reader who waits for the writer. So once a range's requests completed,
// its bytes not yet acknowledged are copied into the ring, which sends
// them again if it must, and the memory is free.
func (e *Engine) releaseMems() {
	r := e.sq.released()
	i := 0
	for ; i < len(e.mems) && e.mems[i].end <= r; i++ {
		e.mems[i].m.Done()
	}
	for ; i < len(e.mems) && e.mems[i].end <= e.sq.freed; i++ {
		e.keepMem(e.mems[i])
		e.mems[i].m.Done()
	}
	if i > 0 {
		e.mems = e.mems[:copy(e.mems, e.mems[i:])]
	}
}

// keepMem copies into the transmit ring, at their positions, the bytes
// of s the ring has not freed, so that the ring holds them as it holds
// bytes Write copied.
func (e *Engine) keepMem(s memSeg) {
	from := max(s.start, e.sq.released())
	if from >= s.end {
		return
	}
	src := s.m.Bytes()[s.off+int(from-s.start) : s.off+int(s.end-s.start)]
	copyRing(e.cfg.SendRing, src, 0, from, uint64(len(src)))
	s.m.Kept(len(src))
}

// placeMems copies every range held into the transmit ring (keepMem) and
// gives the memory back: no request that reads it is in flight any more,
// and the ring must hold the bytes (a new link sends them again from it,
// or a grown ring keeps them).
func (e *Engine) placeMems() {
	for _, s := range e.mems {
		e.keepMem(s)
	}
	e.DropMems()
}

// DropMems gives back every range of registered memory held: the link
// that read it is closed.
func (e *Engine) DropMems() {
	for _, s := range e.mems {
		if s.m != nil {
			s.m.Done()
		}
	}
	clear(e.mems)
	e.mems = e.mems[:0]
}
