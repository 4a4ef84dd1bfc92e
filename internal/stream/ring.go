package stream

import "github.com/rdmanet/sdk/internal/wire"

// The ring mode that two rdmanet peers negotiate (wire.FeatureRing): the
// receive buffer is a ring written continuously. The sender writes at its
// running total modulo the ring's size, splitting writes at the ring's end,
// and never gets further ahead of what the receiver has consumed than the
// ring's size. The receiver returns space with Credit messages carrying its
// running total of consumed bytes, a quarter of the ring at a time, so the
// sender never stalls once per buffer as in Valkey's mode.

// RecvRing is this side's receive ring. With FeatureGrow it may be
// replaced mid-stream (grow.go): this side offers a new ring (Ring), the
// peer answers with the position where its bytes start going there
// (RingAt), and the old ring is read up to that position and then given
// back. In every ring, the byte at stream position p is at offset p
// modulo the ring's size, as in a ring that was there from the start: so
// a ring that grew wraps where a fixed one of its size would, at the same
// stream positions as the sender's transmit ring (SendQueue), and a
// stream of writes that divide the ring is never split at its end.
type RecvRing struct {
	mem           []byte // the ring being read
	size          uint64
	written, read uint64 // running totals
	credited      uint64 // freed, as last told to the peer
	// Views (view.go): bytes read in place and not yet released, oldest
	// first. The ring's space is given back up to the oldest view still
	// held (freed), not up to read.
	views       *[]heldView // the engine's (nil: none are taken)
	creditEvery uint64
	peerRetain  uint64

	offered *ringSpan // a ring offered to the peer, which it has not yet switched to
	next    *ringSpan // the ring the peer switched to, from next.at on
	retired [][]byte  // rings nothing lands in and nothing reads any more
}

// ringSpan is a receive ring and the stream position from which the
// peer's bytes land in it.
type ringSpan struct {
	mem []byte
	at  uint64
}

// NewRecvRing returns the state of a ring of size bytes. Credit goes back
// every quarter of it, or of peerRetain when the peer keeps its sent bytes
// until they are credited (a resumable session) in a smaller transmit ring:
// a sender that fills what it can retain must see credit come back.
func NewRecvRing(size, peerRetain uint32) *RecvRing {
	r := &RecvRing{size: uint64(size), peerRetain: uint64(peerRetain)}
	r.setCreditEvery()
	return r
}

// setCreditEvery sets how often credit goes: every quarter of the ring,
// of what the peer retains, and, while the peer switches to a ring this
// side offered, of that ring, whichever is smallest.
func (r *RecvRing) setCreditEvery() {
	every := r.size
	if r.peerRetain > 0 {
		every = min(every, r.peerRetain)
	}
	if r.next != nil {
		every = min(every, uint64(len(r.next.mem)))
	}
	r.creditEvery = max(every/4, 1)
}

// SetPeerRetain takes the peer's Retain: its transmit ring, which holds
// what it sent until credited, is now n bytes. Credit goes every quarter
// of it from now on (and of the ring, if smaller, also while it switches).
// A smaller one could already be full of bytes read and not credited: it
// returns the Credit to send now.
func (r *RecvRing) SetPeerRetain(n uint32) (credit wire.Message, send bool) {
	r.peerRetain = uint64(n)
	r.setCreditEvery()
	if r.freed()-r.credited >= r.creditEvery {
		return r.credit()
	}
	return wire.Message{}, false
}

// Mem is the memory Readable's offsets are in.
func (r *RecvRing) Mem() []byte { return r.mem }

// Totals are the running totals of bytes that arrived and whose space was
// given back (read, and not held in a view).
func (r *RecvRing) Totals() (received, consumed uint64) { return r.written, r.freed() }

// freed is the running total of bytes whose space may be written again:
// read, up to the oldest view still held.
func (r *RecvRing) freed() uint64 {
	if r.views != nil {
		for _, v := range *r.views {
			if !v.copied && !v.released {
				return v.at
			}
		}
	}
	return r.read
}

// Relinked notes that the peer learns the consumed total from Resume, and
// withdraws a ring offered that the peer did not switch to (its RingAt
// would have come before any byte of the new link): the peer writes where
// this side announces on the new link, WriteMem, and the ring offered is
// given back (retired).
func (r *RecvRing) Relinked() {
	r.credited = r.freed()
	if r.offered != nil {
		r.retired = append(r.retired, r.offered.mem)
		r.offered = nil
	}
}

// WriteMem is the ring the peer writes into now: the one it switched to,
// if it did.
func (r *RecvRing) WriteMem() []byte {
	if r.next != nil {
		return r.next.mem
	}
	return r.mem
}

// Arrived records n bytes written by the peer at the ring's write position
// (in the ring it switched to, if it did). A write that overruns the space
// the peer was given, or crosses the ring's end, is a protocol error.
func (r *RecvRing) Arrived(n uint32) error {
	size := r.size
	if r.next != nil {
		size = uint64(len(r.next.mem))
	}
	if unread := r.written - r.freed(); unread > size || uint64(n) > size-unread {
		return protocolErrorf("peer wrote %d bytes into a ring with %d free", n, size-min(size, unread))
	}
	if off := r.written % size; off+uint64(n) > size {
		return protocolErrorf("peer write of %d bytes at ring offset %d crosses the ring's end", n, off)
	}
	r.written += uint64(n)
	return nil
}

// Readable returns the contiguous unread bytes: ring offset and length.
func (r *RecvRing) Readable() (off, n uint32) {
	r.advance()
	limit := r.written
	if r.next != nil {
		limit = r.next.at
	}
	o := r.read % r.size
	return uint32(o), uint32(min(limit-r.read, r.size-o))
}

// advance moves reading to the ring the peer switched to, once everything
// before the switch was read; the old ring is retired.
func (r *RecvRing) advance() {
	if r.next == nil || r.read != r.next.at {
		return
	}
	if r.mem != nil {
		r.retired = append(r.retired, r.mem)
	}
	r.mem, r.size, r.next = r.next.mem, uint64(len(r.next.mem)), nil
	r.setCreditEvery()
}

// Consume marks n readable bytes as read and returns the Credit message to
// send, if the read crossed a multiple of creditEvery since the last one.
// Multiples, not creditEvery after the last Credit: a Credit sent between
// them (a ring switch sends one) would shift every later one, and the
// sender, whose room ends at what was credited, would split each write
// that the ring divides into two (half the throughput, on the host).
func (r *RecvRing) Consume(n uint32) (credit wire.Message, send bool) {
	if uint64(n) > r.written-r.read {
		panic("stream: Consume beyond what arrived")
	}
	r.read += uint64(n)
	r.advance()
	return r.freedCredit()
}

// freedCredit returns the Credit to send, if the space given back crossed
// a multiple of creditEvery since the last one.
func (r *RecvRing) freedCredit() (credit wire.Message, send bool) {
	if r.freed()/r.creditEvery == r.credited/r.creditEvery {
		return wire.Message{}, false
	}
	return r.credit()
}

// credit is the Credit for all the space given back, if any of it is not
// credited.
func (r *RecvRing) credit() (wire.Message, bool) {
	freed := r.freed()
	if freed == r.credited {
		return wire.Message{}, false
	}
	r.credited = freed
	return wire.Message{Op: wire.OpCredit, ConsumedBytes: freed}, true
}

// WriteSize is the size of the ring the peer writes into: the one it
// switched to, if it did.
func (r *RecvRing) WriteSize() int {
	if r.next != nil {
		return len(r.next.mem)
	}
	return int(r.size)
}

// Changing reports whether a ring was offered and the peer has not yet
// switched to it, or has and the old one is still read.
func (r *RecvRing) Changing() bool { return r.offered != nil || r.next != nil }

// Offer records mem as the ring offered to the peer (Ring).
func (r *RecvRing) Offer(mem []byte) { r.offered = &ringSpan{mem: mem} }

// SwitchAt takes the peer's RingAt: its bytes from position at on land in
// the offered ring. Bytes read and not yet credited count against the new
// ring at the peer: a smaller one could be full of them, so it returns the
// Credit to send now, and credit goes every quarter of the smaller ring
// until the switch.
func (r *RecvRing) SwitchAt(at uint64) (credit wire.Message, send bool, err error) {
	switch {
	case r.offered == nil:
		return wire.Message{}, false, protocolErrorf("RingAt without a ring offered")
	case at != r.written:
		return wire.Message{}, false, protocolErrorf("RingAt at %d bytes; %d arrived before it", at, r.written)
	}
	r.next, r.offered = r.offered, nil
	r.next.at = at
	r.setCreditEvery()
	credit, send = r.credit()
	r.advance()
	return credit, send, nil
}

// SendRing is the peer's receive ring as this side writes into it. With
// FeatureGrow the peer may offer another (Offer): this side writes no more
// until it switched (Switch, when its RingAt is posted), and from then on
// the stream's bytes go to the new ring, each at its stream position
// modulo the ring's size (RecvRing).
type SendRing struct {
	addr           uint64
	size           uint64
	rkey           uint32
	announced      bool
	sent, peerRead uint64 // running totals
	offer          *wire.Message
	prevSize       uint64 // the ring's size before the last Switch
}

// Announce takes the peer's RegisterXferMemory, which in ring mode comes
// once, at the start.
func (s *SendRing) Announce(m wire.Message) error {
	if s.announced {
		return protocolErrorf("ring announced twice")
	}
	if m.Length == 0 || m.Addr+uint64(m.Length) < m.Addr {
		return protocolErrorf("peer announced an unusable ring (%d bytes at %#x)", m.Length, m.Addr)
	}
	s.addr, s.size, s.rkey, s.announced = m.Addr, uint64(m.Length), m.RKey, true
	return nil
}

// Offer takes the peer's Ring: a ring to switch to.
func (s *SendRing) Offer(m wire.Message) error {
	switch {
	case !s.announced:
		return protocolErrorf("ring offered before the first was announced")
	case s.offer != nil:
		return protocolErrorf("ring offered while an offer is pending")
	case m.Length == 0 || m.Length > maxRing || m.Addr+uint64(m.Length) < m.Addr:
		return protocolErrorf("peer offered an unusable ring (%d bytes at %#x)", m.Length, m.Addr)
	}
	s.offer = &m
	return nil
}

// Switch moves to the offered ring at the current position and returns the
// RingAt that tells the peer so.
func (s *SendRing) Switch() wire.Message {
	m := s.offer
	s.prevSize = s.size
	s.addr, s.size, s.rkey, s.offer = m.Addr, uint64(m.Length), m.RKey, nil
	return wire.Message{Op: wire.OpRingAt, At: s.sent}
}

// Credit takes the peer's running total of consumed bytes.
func (s *SendRing) Credit(m wire.Message) error {
	if !s.announced {
		return protocolErrorf("credit before the ring was announced")
	}
	if m.ConsumedBytes < s.peerRead || m.ConsumedBytes > s.sent {
		return protocolErrorf("credit for %d bytes consumed; %d were sent and %d already credited", m.ConsumedBytes, s.sent, s.peerRead)
	}
	s.peerRead = m.ConsumedBytes
	return nil
}

// Room is how many bytes may be written now, contiguously up to the ring's
// end. Bytes not yet credited count against the ring, whichever ring they
// went to, as the peer counts them (RecvRing.Arrived).
func (s *SendRing) Room() uint32 {
	if !s.announced || s.offer != nil || s.sent-s.peerRead >= s.size {
		return 0
	}
	off := s.sent % s.size
	return uint32(min(s.size-(s.sent-s.peerRead), s.size-off))
}

// Take reserves up to n bytes and returns where they go.
func (s *SendRing) Take(n uint32) (remoteAddr uint64, rkey uint32, got uint32) {
	got = min(n, s.Room())
	remoteAddr = s.addr + s.sent%s.size
	s.sent += uint64(got)
	return remoteAddr, s.rkey, got
}

// Sent is the running total of bytes taken.
func (s *SendRing) Sent() uint64 { return s.sent }

// Relink forgets the peer's ring, which its new link announces again (the
// one it reads from the bytes this side sends again on: a switch whose
// RingAt the lost link may have lost is the announcement's to decide),
// and an offer not yet switched to, which the peer withdraws. unsent
// bytes that a Rewind took back and were not sent again count as sent,
// until the next Rewind.
func (s *SendRing) Relink(unsent uint64) {
	s.announced = false
	s.offer = nil
	s.sent += unsent
}

// Rewind takes the peer's Resume: it received the stream up to received and
// read it up to consumed. What follows received is sent again.
func (s *SendRing) Rewind(received, consumed uint64) error {
	if consumed > received || received > s.sent || consumed < s.peerRead || received-consumed > max(s.size, s.prevSize) {
		return protocolErrorf("resume at %d bytes received, %d consumed; %d were sent and %d credited", received, consumed, s.sent, s.peerRead)
	}
	s.sent, s.peerRead = received, consumed
	return nil
}

// Target is the ring's base address and key, for a zero-length write.
func (s *SendRing) Target() (addr uint64, rkey uint32, ok bool) {
	return s.addr, s.rkey, s.announced
}
