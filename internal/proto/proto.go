// Package proto holds the state machines of rdmanet's RDMA data path, in pure
// Go: the receive window (where the peer's writes land and what Read may
// consume), the send window (the peer's buffer this side writes into), and the
// accounting of the send queue and transmit ring (which posted work requests
// are signaled, and what their completions free). The connection code only
// moves bytes and calls verbs; every decision about offsets, limits and
// protocol errors is made here, where it is tested and fuzzed without RDMA.
package proto

import (
	"fmt"

	"github.com/rdmanet/sdk/internal/wire"
)

func protocolErrorf(format string, args ...any) error {
	return &wire.ProtocolError{Reason: fmt.Sprintf(format, args...)}
}

// RecvWindow is this side's receive buffer in Valkey's protocol: the peer
// writes contiguously from 0; when the reader has consumed the whole buffer,
// both positions go back to 0 and the buffer is announced again
// (RegisterXferMemory).
type RecvWindow struct {
	size, written, read uint32
}

// NewRecvWindow returns a window over a buffer of size bytes.
func NewRecvWindow(size uint32) RecvWindow { return RecvWindow{size: size} }

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

// Consume marks n readable bytes as read. It reports true when the buffer is
// now wholly consumed: the positions are reset and the caller must announce
// the buffer again.
func (w *RecvWindow) Consume(n uint32) (reannounce bool) {
	if n > w.written-w.read {
		panic("proto: Consume beyond what arrived")
	}
	w.read += n
	if w.read == w.size {
		w.read, w.written = 0, 0
		return true
	}
	return false
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
