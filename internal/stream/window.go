// Windows: where the peer's writes land on this side and what Read may
// consume (Receiver), and the peer's buffer as this side writes into it
// (Sender), in Valkey's one-shot window mode (this file) and in rdmanet's
// ring mode (ring.go).
package stream

import (
	"fmt"

	"github.com/rdmanet/sdk/internal/wire"
)

func protocolErrorf(format string, args ...any) error {
	return &wire.ProtocolError{Reason: fmt.Sprintf(format, args...)}
}

// Receiver is the receive side of a wire mode: where the peer's writes land
// and what Read may take.
type Receiver interface {
	// Arrived records n bytes the peer wrote (a write-with-immediate's
	// immediate); writing outside what the peer was given is a protocol error.
	Arrived(n uint32) error
	// Readable returns the offset and length of contiguous unread bytes.
	Readable() (off, n uint32)
	// Consume marks n readable bytes read and returns the control message
	// that gives the space back to the peer, when one is due.
	Consume(n uint32) (reply wire.Message, send bool)
	// Mem is the memory Readable's offsets are in.
	Mem() []byte
}

// Sender is the send side of a wire mode: the peer's buffer as this side
// writes into it.
type Sender interface {
	// Announce takes the peer's RegisterXferMemory.
	Announce(m wire.Message) error
	// Credit takes the peer's Credit.
	Credit(m wire.Message) error
	// Room is how many bytes may be written now, contiguously.
	Room() uint32
	// Take reserves up to n bytes and returns where they go.
	Take(n uint32) (remoteAddr uint64, rkey uint32, got uint32)
	// Target is a valid destination for a zero-length write.
	Target() (addr uint64, rkey uint32, ok bool)
}

var (
	_ Receiver = (*RecvWindow)(nil)
	_ Receiver = (*RecvRing)(nil)
	_ Sender   = (*SendWindow)(nil)
	_ Sender   = (*SendRing)(nil)
)

// RecvWindow is this side's receive buffer in Valkey's protocol: the peer
// writes contiguously from 0; when the reader has consumed the whole buffer,
// both positions go back to 0 and the buffer is announced again
// (RegisterXferMemory).
type RecvWindow struct {
	mem                 []byte
	size, written, read uint32
	total               uint64 // bytes of the buffers read whole before
	announce            wire.Message
}

// NewRecvWindow returns the window over the buffer that announce (a
// RegisterXferMemory) describes; Consume returns announce again each time the
// buffer has been read through.
func NewRecvWindow(announce wire.Message) *RecvWindow {
	return &RecvWindow{size: announce.Length, announce: announce}
}

// Arrived records n bytes written by the peer (a write-with-immediate's
// immediate). Writing past the buffer is a protocol error: the bytes would
// already be outside it.
func (w *RecvWindow) Arrived(n uint32) error {
	if n > w.size-w.written {
		return protocolErrorf("peer wrote %d bytes at offset %d of a %d-byte receive buffer", n, w.written, w.size)
	}
	w.written += n
	return nil
}

// Readable returns the offset and length of the bytes that arrived and were
// not yet consumed.
func (w *RecvWindow) Readable() (off, n uint32) { return w.read, w.written - w.read }

// Consume marks n readable bytes as read. When the buffer is now wholly
// consumed, the positions are reset and it returns the announcement to send
// again.
func (w *RecvWindow) Consume(n uint32) (reply wire.Message, send bool) {
	if n > w.written-w.read {
		panic("stream: Consume beyond what arrived")
	}
	w.read += n
	if w.read == w.size {
		w.total += uint64(w.size)
		w.read, w.written = 0, 0
		return w.announce, true
	}
	return wire.Message{}, false
}

// Mem is the buffer.
func (w *RecvWindow) Mem() []byte { return w.mem }

// replace makes mem, which announce names, the buffer: after a wrap, when
// nothing is in the old one.
func (w *RecvWindow) replace(mem []byte, announce wire.Message) {
	w.mem, w.size, w.announce = mem, announce.Length, announce
}

// SendWindow is the peer's receive buffer as this side writes into it.
type SendWindow struct {
	addr       uint64
	size, used uint32
	rkey       uint32
	announced  bool
}

// Announce takes the peer's RegisterXferMemory: a new (or the same) buffer,
// written from its start again.
func (s *SendWindow) Announce(m wire.Message) error {
	if m.Length == 0 {
		return protocolErrorf("peer announced an empty receive buffer")
	}
	if m.Addr+uint64(m.Length) < m.Addr {
		return protocolErrorf("peer announced a receive buffer that wraps the address space")
	}
	*s = SendWindow{addr: m.Addr, size: m.Length, rkey: m.RKey, announced: true}
	return nil
}

// Credit is not part of Valkey's protocol.
func (s *SendWindow) Credit(wire.Message) error {
	return protocolErrorf("credit message without the ring extension")
}

// Room is how many bytes may be written before the peer announces again.
func (s *SendWindow) Room() uint32 {
	if !s.announced {
		return 0
	}
	return s.size - s.used
}

// Target is where the window currently ends up: its base address and key,
// for a zero-length write that only needs a valid destination.
func (s *SendWindow) Target() (addr uint64, rkey uint32, ok bool) {
	return s.addr, s.rkey, s.announced
}

// Take reserves up to n bytes of the window and returns where they go.
func (s *SendWindow) Take(n uint32) (remoteAddr uint64, rkey uint32, got uint32) {
	got = min(n, s.Room())
	remoteAddr = s.addr + uint64(s.used)
	s.used += got
	return remoteAddr, s.rkey, got
}
