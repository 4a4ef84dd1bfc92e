package stream

import (
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Rings that follow traffic (issue 24; docs/protocol.md, "Rings that
// follow traffic"). A connection starts with the link's small rings and
// grows them, four times at a step, up to Config's sizes while its stream
// is busy;
// after ShrinkAfter without data they go back to their first sizes.
//
//   - The transmit ring is this side's alone: a Write that found it full
//     asks for the largest, Writes wait until every byte in it completed,
//     and Flush replaces it (link.Rings.ReplaceSendRing); a Write of more
//     than a quarter of it asks for four times the Write; and where the
//     peer credits every quarter of it (Retain), a ring's worth written
//     within growPeriod asks for four times it (sendRate).
//   - The receive ring, between rdmanet peers (wire.FeatureGrow): when a
//     ring's worth of bytes arrived within growPeriod, or the ring is full
//     of bytes not yet read, Flush makes a larger one and offers it (Ring). The peer posts what it holds, switches at
//     its running total and says so (RingAt), in order with its writes; this
//     side reads the old ring up to there, then gives it back.
//   - The receive buffer in Valkey's protocol can only be announced again
//     once the peer has filled it and this side read it whole: it grows
//     then, if the buffer filled within growPeriod, and never shrinks.
//
// Four times at a step, from a ring's worth: a stream reaches 256 KiB
// rings after 80 KiB (16 and 64 KiB of receive ring), so a short burst
// pays little for the small start, as TCP's slow start costs a few round
// trips.
//
// maxRing bounds what a peer may offer.
const maxRing = 1 << 30

// growPeriod: a ring's worth of bytes arriving within it is a stream
// that a larger ring would carry faster.
const growPeriod = time.Second

// growStep is how many times larger each new ring is.
const growStep = 4

// growth is the engine's state of its rings' sizes.
type growth struct {
	send, recv  bool // the rings may change (the link can, and the mode allows it)
	firstSend   int
	firstRecv   int
	maxSend     int
	maxRecv     int
	shrinkAfter time.Duration

	markBytes uint64    // the received total when the rate's period began
	markAt    time.Time // when it began
	// sendMark and sendMarkAt are the same for the bytes written, where
	// the transmit ring's size sets how often the peer credits (retains).
	sendMark   uint64
	sendMarkAt time.Time
	// lastTotal is the bytes written and received as Tick last saw them,
	// and lastTraffic when they last changed: no clock is read per Write
	// or arrival.
	lastTotal   uint64
	lastTraffic time.Time

	wantSend int  // the size the transmit ring becomes once empty (Flush)
	wantRecv int  // the size of a receive ring to make and offer (Flush)
	wrapped  bool // Valkey's protocol: the buffer was read whole, its announcement waits for Flush
}

// relinked: the engine runs on another link, which may make rings where
// the last one could not (a group's stream back on RDMA from its TCP
// link, which makes none): the bounds its failures set are lifted.
func (g *growth) relinked(cfg Config) {
	g.maxSend = max(cfg.MaxSendRing, len(cfg.SendRing))
	g.maxRecv = max(cfg.MaxRecvRing, g.firstRecv)
}

func newGrowth(cfg Config) growth {
	g := growth{
		firstSend: len(cfg.SendRing), firstRecv: len(cfg.RecvRing),
		maxSend: max(cfg.MaxSendRing, len(cfg.SendRing)), maxRecv: max(cfg.MaxRecvRing, len(cfg.RecvRing)),
		shrinkAfter: cfg.ShrinkAfter,
	}
	// A resumable stream's rings grow too, on a link that makes rings (a
	// group's stream, whose rings move with it): Relink announces the ring
	// the peer writes into now, and a switch the lost link left half done
	// is undone (the offer is withdrawn, the peer writes on where the
	// announcement says). A session's link makes none (its rings are the
	// session's), and growth stops at the first Flush.
	g.send = g.maxSend > g.firstSend || g.shrinkAfter > 0
	ring := cfg.Features&wire.FeatureRing != 0
	g.recv = (!ring || cfg.Features&wire.FeatureGrow != 0) && (g.maxRecv > g.firstRecv || g.shrinkAfter > 0)
	return g
}

// sendFull notes a Write that found the transmit ring full while the
// peer had room: the connection streams, and the ring goes to its largest
// at once (each step costs a drain: every byte in the ring must complete).
func (e *Engine) sendFull() {
	g := &e.grow
	if g.send && g.wantSend == 0 && int(e.sq.ring) < g.maxSend {
		g.wantSend = g.maxSend
	}
}

// sendLarge notes a Write of n bytes: one larger than a quarter of the
// transmit ring (its largest single write) would go as several writes,
// each signaled as the ring runs half full, so the ring grows to four
// times it at once (requests of a few KiB take one write each).
func (e *Engine) sendLarge(n int) {
	g := &e.grow
	e.sendRate()
	if !g.send || g.wantSend != 0 || n <= int(e.sq.chunk) || int(e.sq.ring) >= g.maxSend {
		return
	}
	size := int(e.sq.ring) * growStep
	for size < 4*n && size < g.maxSend {
		size *= growStep
	}
	g.wantSend = min(size, g.maxSend)
}

// sendRate grows the transmit ring of a stream whose peer credits every
// quarter of it (Retain: a resumable stream retains what it sent until
// credited) when a ring's worth was written within growPeriod, as the
// receive ring grows for a ring's worth arrived: each quarter written
// draws a Credit, and a stream of answers smaller than a quarter (4 KiB
// reads at queue depth 1) never fills the ring to make it grow otherwise.
// The clock is read once per ring's worth, not per Write.
func (e *Engine) sendRate() {
	g := &e.grow
	if !e.retains() || !g.send || g.wantSend != 0 || int(e.sq.ring) >= g.maxSend {
		return
	}
	written := e.send.(*SendRing).Sent()
	if written-g.sendMark < e.sq.ring {
		return
	}
	now := e.cfg.Clock()
	fast := !g.sendMarkAt.IsZero() && now.Sub(g.sendMarkAt) <= growPeriod
	g.sendMark, g.sendMarkAt = written, now
	if fast {
		g.wantSend = min(int(e.sq.ring)*growStep, g.maxSend)
	}
}

// retains reports whether the peer credits every quarter of this side's
// transmit ring, which it learns from Retain.
func (e *Engine) retains() bool {
	return e.resumable && e.cfg.Features&wire.FeatureRetain != 0
}

// dataArrived counts arrived bytes toward the receive ring's growth: a
// ring's worth since the last within growPeriod grows it, and so does a
// ring full of bytes the application has not read. The clock is read once
// per ring's worth, not per arrival.
func (e *Engine) dataArrived() {
	g := &e.grow
	if !g.recv {
		return
	}
	received, size := e.received(), e.recvSize()
	if received-g.markBytes < uint64(size) {
		return
	}
	now := e.cfg.Clock()
	fast := now.Sub(g.markAt) <= growPeriod
	g.markBytes, g.markAt = received, now
	want := min(size*growStep, g.maxRecv)
	// The peer has more to say than the application takes yet: the
	// largest ring holds it at once, as a socket's receive buffer does, so
	// that a Write the peer makes before reading its answer does not block
	// at the first ring's worth (both sides writing first would deadlock
	// there). At once, because no further ring is offered while the full
	// one is unread.
	if r, ok := e.recv.(*RecvRing); ok && r.written-r.freed() >= uint64(size) {
		fast, want = true, g.maxRecv
	}
	if fast && size < g.maxRecv && g.wantRecv == 0 && !e.recvChanging() {
		g.wantRecv = want
	}
}

// received is the running total of bytes that arrived (in Valkey's
// protocol, since the buffer was last announced, plus those before).
func (e *Engine) received() uint64 {
	switch r := e.recv.(type) {
	case *RecvRing:
		return r.written
	case *RecvWindow:
		return r.total + uint64(r.written)
	}
	return 0
}

// recvSize is the size of the receive ring being written into.
func (e *Engine) recvSize() int {
	switch r := e.recv.(type) {
	case *RecvRing:
		return r.WriteSize()
	case *RecvWindow:
		return int(r.size)
	}
	return 0
}

// recvChanging reports whether a receive ring was offered and the peer has
// not yet switched to it, or has and the old one is still read.
func (e *Engine) recvChanging() bool {
	r, ok := e.recv.(*RecvRing)
	return ok && r.Changing()
}

// shrinkIdle asks for the first sizes again once no data moved for
// ShrinkAfter (Tick).
func (e *Engine) shrinkIdle(now time.Time) {
	g := &e.grow
	if total := e.sq.put + e.sq.held + e.received(); total != g.lastTotal {
		g.lastTotal, g.lastTraffic = total, now
		return
	}
	if g.shrinkAfter <= 0 || now.Sub(g.lastTraffic) < g.shrinkAfter || e.draining {
		return
	}
	if g.send && int(e.sq.ring) > g.firstSend && g.wantSend == 0 {
		g.wantSend = g.firstSend
	}
	// Valkey's buffer never shrinks: it would wait for a wrap that an idle
	// peer never makes.
	if _, ring := e.recv.(*RecvRing); ring && g.recv && e.recvSize() > g.firstRecv && g.wantRecv == 0 && !e.recvChanging() {
		g.wantRecv = g.firstRecv
	}
}

// growthDue reports whether Flush has rings to make, replace or give back.
func (e *Engine) growthDue() bool {
	g := &e.grow
	if g.wantSend > 0 || g.wantRecv > 0 || g.wrapped {
		return true
	}
	r, ok := e.recv.(*RecvRing)
	return ok && len(r.retired) > 0 && !r.holdsRing()
}

// applyGrowth makes, replaces and gives back rings on the link (Flush).
// A link that cannot make rings keeps the ones it has; a ring it refuses
// to make stops growth of that kind for the connection's life, as a
// smaller ring is only slower.
func (e *Engine) applyGrowth(l Poster) {
	g := &e.grow
	rl, ok := l.(link.Rings)
	if !ok {
		g.send, g.recv, g.wantSend, g.wantRecv = false, false, 0, 0
		if g.wrapped {
			g.wrapped = false
			e.queueReply(e.ctl.announce)
		}
		return
	}
	// A ring a view may be in waits, retired, for its last one (view.go).
	if r, ok := e.recv.(*RecvRing); ok && !r.holdsRing() {
		for _, mem := range r.retired {
			if err := rl.ReleaseRecvRing(mem); err != nil {
				e.Fail(err)
				return
			}
		}
		clear(r.retired)
		r.retired = r.retired[:0]
	}
	// Not while bytes wait to be sent again after a Resume: they are in
	// the ring, beyond what the queue counts.
	// Nor under a write buffer held in it (view.go).
	if size := g.wantSend; size > 0 && e.sq.Completed() && e.resend == 0 && !e.resuming && !e.reservedInRing {
		g.wantSend = 0
		e.replaceSendRing(rl, size)
	}
	switch r := e.recv.(type) {
	case *RecvRing:
		if size := g.wantRecv; size > 0 {
			g.wantRecv = 0
			mem, addr, rkey, err := rl.NewRecvRing(size)
			if err != nil {
				g.maxRecv = min(g.maxRecv, e.recvSize())
				return
			}
			r.Offer(mem)
			e.ctl.ring = wire.Message{Op: wire.OpRing, Addr: addr, Length: uint32(len(mem)), RKey: rkey}
			e.ctl.want |= wantRing
			e.flushControl()
		}
	case *RecvWindow:
		if !g.wrapped {
			return
		}
		g.wrapped = false
		if size := g.wantRecv; size > 0 {
			g.wantRecv = 0
			if mem, addr, rkey, err := rl.NewRecvRing(size); err != nil {
				g.maxRecv = int(r.size)
			} else {
				// The peer filled the old buffer and waits for this
				// announcement: nothing lands in the old one any more.
				old := r.mem
				r.replace(mem, wire.Message{Op: wire.OpRegisterXferMemory, Addr: addr, Length: uint32(len(mem)), RKey: rkey})
				e.ctl.announce = r.announce
				if old != nil {
					if err := rl.ReleaseRecvRing(old); err != nil {
						e.Fail(err)
						return
					}
				}
			}
		}
		e.queueReply(r.announce)
	}
}

// replaceSendRing makes the transmit ring size bytes. A resumable stream's
// ring also holds bytes the peer has read but not yet acknowledged: its
// Credit comes only every quarter of a ring, so the tail of a small
// answer may wait for it until the peer reads more. Waiting for it would
// stall a Write that wants a larger ring, and the peer may be waiting for
// that Write. So they move to the new ring, at their stream positions, to
// be sent again from there after a failover. A smaller ring that cannot
// hold them is not made: shrinking is only thrift, and the next idle
// moment tries again.
func (e *Engine) replaceSendRing(rl link.Rings, size int) {
	e.placeMems() // nothing in flight reads them: they are kept in the ring
	from, n := e.sq.Kept()
	if n > uint64(size) {
		return
	}
	var kept []byte
	if n > 0 {
		// The link frees the old ring as it makes the new one. Rare (a
		// ring grows a few times in a stream's life): a copy of its own.
		kept = make([]byte, n)
		copyRing(kept, e.cfg.SendRing, from, 0, n)
	}
	mem, err := rl.ReplaceSendRing(size)
	if err != nil {
		g := &e.grow
		g.maxSend = int(e.sq.ring)
		return
	}
	copyRing(mem, kept, 0, from, n)
	e.cfg.SendRing = mem
	e.sq.Resize(uint64(len(mem)))
	if e.queueRetain() {
		e.flushControl()
	}
}

// queueRetain queues a Retain saying what the transmit ring retains now,
// where both agreed on it: a resumable stream keeps what it sent until
// credited, and the peer credits every quarter of that. It reports
// whether it queued one.
func (e *Engine) queueRetain() bool {
	if !e.retains() {
		return false
	}
	e.ctl.retain = wire.Message{Op: wire.OpRetain, Length: uint32(len(e.cfg.SendRing))}
	e.ctl.want |= wantRetain
	return true
}

// retainTold takes the peer's Retain: its transmit ring's size, which
// sets how often this side credits (RecvRing.SetPeerRetain).
func (e *Engine) retainTold(m wire.Message) {
	r, ok := e.recv.(*RecvRing)
	switch {
	case !ok || e.cfg.Features&wire.FeatureRetain == 0:
		e.Fail(protocolErrorf("Retain without the Retain extension"))
		return
	case m.Length == 0 || m.Length > maxRing:
		e.Fail(protocolErrorf("Retain of a %d-byte transmit ring", m.Length))
		return
	case !e.resumable:
		return // the peer keeps nothing for credit
	}
	if credit, send := r.SetPeerRetain(m.Length); send {
		e.queueReply(credit)
	}
}

// copyRing copies n bytes from src, starting at stream position from, to
// dst at stream position to; a ring's offset is its position modulo its
// size, and either side may wrap.
func copyRing(dst, src []byte, from, to, n uint64) {
	for n > 0 {
		so, do := from%uint64(len(src)), to%uint64(len(dst))
		k := min(n, uint64(len(src))-so, uint64(len(dst))-do)
		copy(dst[do:do+k], src[so:so+k])
		from, to, n = from+k, to+k, n-k
	}
}

// ringOffered takes the peer's Ring: this side posts what it holds, then
// switches and says where (RingAt, which flushControl sends once nothing
// is held).
func (e *Engine) ringOffered(m wire.Message) {
	s, ok := e.send.(*SendRing)
	if !ok || e.cfg.Features&wire.FeatureGrow == 0 {
		e.Fail(protocolErrorf("Ring without the ring growth extension"))
		return
	}
	if err := s.Offer(m); err != nil {
		e.Fail(err)
		return
	}
	e.postHeld(false)
	e.ctl.want |= wantRingAt
}

// ringAt takes the peer's RingAt: its bytes from m.At on land in the ring
// this side offered.
func (e *Engine) ringAt(m wire.Message) {
	r, ok := e.recv.(*RecvRing)
	if !ok || e.cfg.Features&wire.FeatureGrow == 0 {
		e.Fail(protocolErrorf("RingAt without the ring growth extension"))
		return
	}
	credit, send, err := r.SwitchAt(m.At)
	if err != nil {
		e.Fail(err)
		return
	}
	if send {
		e.queueReply(credit)
	}
}
