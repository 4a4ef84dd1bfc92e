package stream

import (
	"errors"
	"io"
	"unsafe"
)

// Zero-copy (issue 26): received bytes read in place, as views into the
// receive ring, and bytes written in place, into a reserved part of the
// transmit ring.
//
// A view's bytes are read (Read returns what follows them) but their space
// is not given back to the peer until the view is released: credit stops
// at the oldest view still held, whatever was released after it. Views
// are released in any order. A ring a view is in is never given back
// (grow.go): a ring that was replaced waits, retired, for its last view.
//
// Where n bytes are not contiguous in one ring (they cross its end or a
// switch to a new ring, or the ring is smaller than n), and in Valkey's
// window mode, whose buffer is announced again once read whole, a view is
// a copy: it holds no ring space and is released like any other.
//
// A write buffer is the transmit ring's free space after every byte
// written, reserved until it is committed: Writes wait behind it, and the
// ring is not replaced while it is held. Committed, its bytes are posted
// from where they are, as a Write's would be once copied; where n free
// bytes are not contiguous, the buffer is a copy, and committing it copies.

var (
	// ErrNotView is the error of releasing a slice that is not a view
	// held on the connection: never returned by ReadView, already
	// released, or resliced.
	ErrNotView = errors.New("rdmanet: not a view held on this connection")
	// ErrViewsFull is the error of a ReadView that cannot be satisfied
	// until views are released: the views held fill the receive ring, so
	// the peer may send nothing more, and the ring cannot grow.
	ErrViewsFull = errors.New("rdmanet: the views held fill the receive ring; release some first")
	// ErrTooManyViews is the error of a ReadView while MaxViews views are
	// held.
	ErrTooManyViews = errors.New("rdmanet: too many views held")
	// ErrBufferHeld is the error of a Write, or a WriteBuffer, while a
	// write buffer is held (not yet committed).
	ErrBufferHeld = errors.New("rdmanet: a write buffer is held; commit it first")
	// ErrNoBuffer is the error of a Commit with no write buffer held, or
	// of more bytes than it has.
	ErrNoBuffer = errors.New("rdmanet: commit without a write buffer of that size")
)

// MaxViews bounds the views a connection holds at once.
const MaxViews = 4096

// heldView is a view handed out and not yet released.
type heldView struct {
	at, n    uint64 // its stream position and length
	data     *byte  // its first byte, which names it
	copied   bool   // a copy: it holds no ring space
	released bool   // released, behind a view still held
}

// holdsRing reports whether any view in the ring is held: one holds the
// bytes from its position, before the read position (freed).
func (r *RecvRing) holdsRing() bool { return r.freed() < r.read }

// View returns the next n received bytes, in place when they are
// contiguous in the receive ring. It returns ErrWouldBlock until n bytes
// arrived; at the end of the stream, the bytes that remain with
// io.ErrUnexpectedEOF (io.EOF with none), and the stream's error after a
// failure, as Read does. n must be positive.
func (e *Engine) View(n int) ([]byte, error) {
	e.viewWant = 0
	if n <= 0 {
		return nil, errors.New("rdmanet: ReadView of a non-positive length")
	}
	if len(e.views) >= MaxViews {
		return nil, ErrTooManyViews
	}
	r, ring := e.recv.(*RecvRing)
	if ring && len(e.pending) == 0 {
		off, k := r.Readable()
		if int(k) >= n {
			b := r.Mem()[off : off+uint32(n) : off+uint32(n)]
			e.views = append(e.views, heldView{at: r.read, n: uint64(n), data: unsafe.SliceData(b)})
			r.read += uint64(n)
			r.advance()
			return b, nil
		}
		if r.inPlaceLater(n) && !e.ended() {
			e.viewWant, e.viewInPlace = n, true
			return nil, e.recvBlocked(true)
		}
	}
	return e.viewCopy(n)
}

// ViewUpTo returns the received bytes that are contiguous now, up to
// most, in place in the receive ring: as View, but for as many bytes as
// can be had without a copy (at least one). Bytes a copying View left
// pending, and a peer without rings (Valkey), give a copy of what is
// buffered. It returns ErrWouldBlock until a byte arrived.
func (e *Engine) ViewUpTo(most int) ([]byte, error) {
	e.viewWant = 0
	if most <= 0 {
		return nil, errors.New("rdmanet: ReadViewUpTo of a non-positive length")
	}
	if len(e.pending) > 0 {
		return e.View(min(most, len(e.pending)))
	}
	if _, k := e.recv.Readable(); k > 0 {
		if _, ring := e.recv.(*RecvRing); ring {
			return e.View(min(most, int(k)))
		}
		return e.View(min(most, e.Buffered()))
	}
	if e.ended() {
		return e.View(most) // the end of the stream, or its error
	}
	e.viewWant, e.viewInPlace = 1, false
	return nil, e.recvBlocked(true)
}

// inPlaceLater reports whether the n bytes from the read position will be
// contiguous in the ring being read: within its end, and before any switch
// to another ring.
func (r *RecvRing) inPlaceLater(n int) bool {
	if r.offered != nil || (r.next != nil && r.next.at < r.read+uint64(n)) {
		return false
	}
	return r.read%r.size+uint64(n) <= r.size
}

// ended reports whether no more bytes will arrive.
func (e *Engine) ended() bool { return e.err != nil || e.peerGone || e.peerDone }

// viewReady reports whether a View waiting for e.viewWant bytes in the
// ring may go on: they arrived, no more will, they never can be in place
// (when it waits to be in place), or the views held keep them from coming.
func (e *Engine) viewReady(readable uint32) bool {
	if int(readable) >= e.viewWant || e.ended() || e.viewsBlock() {
		return true
	}
	r, ring := e.recv.(*RecvRing)
	return e.viewInPlace && ring && !r.inPlaceLater(e.viewWant)
}

// recvBlocked is the error of a Read or a View that must wait for bytes:
// ErrWouldBlock, or ErrViewsFull when the views held keep them from
// coming. Waiting, it gives back all the space freed, for a View (all)
// or while views are held: credit goes a quarter of the ring at a time,
// and the peer may not send the bytes awaited before the next quarter.
func (e *Engine) recvBlocked(all bool) error {
	if r, ring := e.recv.(*RecvRing); ring && (all || r.holdsRing()) {
		if m, send := r.credit(); send {
			e.queueReply(m)
		}
	}
	if e.viewsBlock() {
		return ErrViewsFull
	}
	return ErrWouldBlock
}

// peerRoom is the most the peer may have sent and this side not freed:
// the ring, or less when the peer keeps what it sent until it is credited
// (a resumable session) in a smaller transmit ring.
func (r *RecvRing) peerRoom() uint64 {
	room := uint64(r.WriteSize())
	if r.peerRetain > 0 {
		room = min(room, r.peerRetain)
	}
	return room
}

// viewsBlock reports whether the views held keep the peer from sending:
// they fill the receive ring, which cannot grow.
func (e *Engine) viewsBlock() bool {
	r, ring := e.recv.(*RecvRing)
	switch {
	case !ring || !r.holdsRing() || r.Changing():
		return false
	case r.written-r.freed() < r.peerRoom():
		return false // the peer has room
	case e.grow.recv && r.WriteSize() < e.grow.maxRecv:
		return false // a ring full of unreleased bytes grows (dataArrived)
	}
	return true
}

// viewCopy is a view that is a copy: it reads n bytes into a new slice.
// Bytes read before n arrived wait in pending, which the next Read or View
// takes first.
func (e *Engine) viewCopy(n int) ([]byte, error) {
	b := e.spareOf(n)
	k := copy(b, e.pending)
	e.pending = e.pending[k:]
	for k < n {
		m, err := e.readRecv(b[k:])
		k += m
		switch {
		case err == ErrWouldBlock || err == ErrViewsFull:
			if k > 0 {
				e.pending = append(b[:k:k], e.pending...)
			}
			e.viewWant, e.viewInPlace = 1, false // any byte takes the copy further
			return nil, e.recvBlocked(true)
		case err == io.EOF && k > 0:
			err = io.ErrUnexpectedEOF
			fallthrough
		case err != nil:
			if k == 0 {
				return nil, err
			}
			b = b[:k:k]
			e.views = append(e.views, heldView{n: uint64(k), data: unsafe.SliceData(b), copied: true})
			return b, err
		}
	}
	e.views = append(e.views, heldView{n: uint64(n), data: unsafe.SliceData(b), copied: true})
	return b, nil
}

// Release gives back a view that View returned. The ring's space up to the
// oldest view still held goes back to the peer, with a Credit when due.
func (e *Engine) Release(b []byte) error {
	i := -1
	if len(b) > 0 {
		for j := range e.views {
			if v := &e.views[j]; v.data == unsafe.SliceData(b) && v.n == uint64(len(b)) && !v.released {
				i = j
				break
			}
		}
	}
	if i < 0 {
		return ErrNotView
	}
	e.views[i].released = true
	if e.views[i].copied {
		e.keepSpare(b)
	}
	k := 0
	for k < len(e.views) && e.views[k].released {
		k++
	}
	e.views = append(e.views[:0], e.views[k:]...)
	if r, ok := e.recv.(*RecvRing); ok {
		if credit, send := r.freedCredit(); send {
			e.queueReply(credit)
		}
	}
	return nil
}

// HoldsMemory reports whether the application holds memory of the
// connection's rings: a view in place, or a write buffer in the transmit
// ring. The rings must outlive both.
func (e *Engine) HoldsMemory() bool {
	if r, ok := e.recv.(*RecvRing); ok && r.holdsRing() {
		return true
	}
	return e.reserved != nil && e.reservedInRing
}

// Reserve returns n bytes to write in place, in the transmit ring after
// every byte written (a copy where n free bytes are not contiguous there).
// It returns ErrWouldBlock until they are free, and the errors of Write.
func (e *Engine) Reserve(n int) ([]byte, error) {
	e.reserveWant, e.memWant = 0, false
	switch {
	case n <= 0:
		return nil, errors.New("rdmanet: WriteBuffer of a non-positive length")
	case e.reserved != nil:
		return nil, ErrBufferHeld
	}
	if err := e.sendErr(); err != nil {
		return nil, err
	}
	if e.suspended() {
		return nil, ErrWouldBlock
	}
	e.sendLarge(n)
	if e.grow.wantSend > 0 {
		// The ring is replaced once what it holds completed.
		e.postSignaled()
		return nil, ErrWouldBlock
	}
	off, free, completing := e.sq.contiguous()
	if off+uint64(n) > e.sq.ring || completing < uint64(n) {
		// Not contiguous; or, in a session, free only once the peer
		// acknowledges bytes it may hold views of: Commit copies, a
		// little at a time if need be.
		e.reserved, e.reservedInRing = e.spareOf(n), false
		return e.reserved, nil
	}
	if free < uint64(n) {
		// The bytes in flight must complete, and say so.
		e.postSignaled()
		e.reserveWant = n
		return nil, ErrWouldBlock
	}
	e.reserved, e.reservedInRing = e.cfg.SendRing[off:off+uint64(n):off+uint64(n)], true
	return e.reserved, nil
}

// Reserved is the write buffer held, or nil.
func (e *Engine) Reserved() []byte { return e.reserved }

// EndReserve ends the write buffer: Commit wrote what it would of it.
func (e *Engine) EndReserve() {
	if !e.reservedInRing {
		e.keepSpare(e.reserved)
	}
	e.reserved, e.reservedInRing = nil, false
}

// spareOf returns n bytes for a copy: the spare slice if it is large
// enough (a copy released, or a copying write buffer committed, leaves it
// for the next), or a new one. A stream of views or buffers larger than
// the ring copies into the same memory each time, not into new memory.
func (e *Engine) spareOf(n int) []byte {
	if cap(e.spare) >= n {
		b := e.spare[:n:n]
		e.spare = nil
		return b
	}
	return make([]byte, n)
}

// keepSpare keeps b, given back, as the spare if it is the largest yet.
func (e *Engine) keepSpare(b []byte) {
	if cap(b) > cap(e.spare) {
		e.spare = b[:0]
	}
}

// ownsReserved reports whether b is the write buffer's, from its start
// or beyond: Write takes it as a commit.
func (e *Engine) ownsReserved(b []byte) bool {
	if len(b) == 0 || e.reserved == nil {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(e.reserved)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p+uintptr(len(b)) <= start+uintptr(len(e.reserved))
}

// inPlace reports whether dst and src are the same bytes: a committed
// write buffer, which is already where Write would copy it.
func inPlace(dst, src []byte) bool {
	return len(src) > 0 && len(dst) > 0 && unsafe.SliceData(dst) == unsafe.SliceData(src)
}

// ViewsHeld counts the views held: in place in a ring, and copies.
func (e *Engine) ViewsHeld() (inPlace, copies int) {
	for _, v := range e.views {
		switch {
		case v.released:
		case v.copied:
			copies++
		default:
			inPlace++
		}
	}
	return inPlace, copies
}

// Queued reports whether requests wait for Flush: a Read or a View that
// must wait may have given space back first (recvBlocked).
func (e *Engine) Queued() bool { return len(e.out) > 0 || e.grow.wrapped }

// Buffered is how many received bytes a Read may take without waiting.
func (e *Engine) Buffered() int {
	n := len(e.pending)
	switch r := e.recv.(type) {
	case *RecvRing:
		n += int(r.written - r.read)
	case *RecvWindow:
		n += int(r.written - r.read)
	}
	return n
}
