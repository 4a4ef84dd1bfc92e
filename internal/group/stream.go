package group

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Stream is one stream of a group: a link.Link whose requests the mux
// posts onto the base link and whose completions it hands over. Its peer
// holds credit for its messages (Caps.RecvCredit and RecvGrant). All its
// state is under the mux's lock.
type Stream struct {
	m         *Mux
	tag, peer wire.StreamTag // its name here, and at the peer
	// The stream's rings, from the base link: its transmit ring (named by
	// sendKey in the base's requests), its first receive ring, and those
	// it grew since (link.Rings).
	send          []byte
	sendKey       uint32
	recv          []byte
	recvAddr      uint64
	recvKey       uint32
	recvGone      bool // the first receive ring was given back
	grown         [][]byte
	caps          link.Caps
	local, remote netip.AddrPort
	port          uint16 // the listener's port it is for
	peerGrant     int
	opened        chan struct{} // closed once the open is answered

	state     streamState
	openErr   error
	abandoned bool // the opener gave up waiting: close it once accepted
	announced bool // the peer knows its tag: its requests may go

	// peerRings are the receive rings the peer's engine announced (its
	// RegisterXferMemory and Ring messages, the last few): the mux fails
	// a write anywhere else before it reaches the base link, so that one
	// stream's bad write cannot end the group.
	peerRings [3]remoteRing
	nextRing  int
	named     remoteRing // the ring the peer named in the open or its answer

	queued        []queuedWR
	inReady       bool
	seq, retired  uint64   // requests posted, and retired by SendDones taken
	controls      []uint64 // seqs of control requests outstanding
	inflight      int      // requests on the base link
	avail         int      // credit the peer holds: messages it may still send
	taken         int      // receives the peer's messages took, not yet posted again
	disconnecting bool     // no more requests go
	closeSent     bool     // this side sent StreamClose
	peerClosed    bool     // the peer sent StreamClose (or refused the open)
	closeAnswered bool     // the peer answered this side's StreamClose
	closed        bool
	freed         bool
	failing       error // a request failed here: the stream fails once what went before completes

	cq     []entry
	down   bool // the terminal completion was queued
	armed  bool
	event  bool
	woken  bool
	waits  int
	notify func()
	cond   sync.Cond // on the mux's lock
}

type streamState uint8

const (
	opening streamState = iota + 1
	open
	refused
)

type remoteRing struct {
	addr uint64
	size uint32
	rkey uint32
}

type queuedWR struct {
	wr    link.SendWR
	seq   uint64
	close uint32 // not a request: send StreamClose with this reason, in order
}

type entry struct {
	c   link.Completion
	seq uint64
}

var (
	_ link.Link          = (*Stream)(nil)
	_ link.RecvGranter   = (*Stream)(nil)
	_ link.PathWatcher   = (*Stream)(nil)
	_ link.Rings         = (*Stream)(nil)
	_ link.PeerRingNamer = (*Stream)(nil)
)

// peerDone reports whether nothing more of the peer's lands on the stream:
// it sent StreamClose, or answered this side's.
func (s *Stream) peerDone() bool { return s.peerClosed || s.closeAnswered }

// Port is the listener's port the stream was opened for.
func (s *Stream) Port() uint16 { return s.port }

// PeerRing is the receive ring the peer named in the open or its answer
// (link.PeerRingNamer).
func (s *Stream) PeerRing() (addr uint64, size uint32, rkey uint32) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	r := s.named
	return r.addr, r.size, r.rkey
}

// PeerGrant is the credit the peer gave first, which its engine's Hello
// would have carried.
func (s *Stream) PeerGrant() int { return s.peerGrant }

// Base is the link the stream's group runs over.
func (s *Stream) Base() link.Link { return s.m.base }

// Tag is the stream's name at this side, for diagnostics.
func (s *Stream) Tag() wire.StreamTag { return s.tag }

func (s *Stream) Caps() link.Caps  { return s.caps }
func (s *Stream) SendRing() []byte { return s.send }
func (s *Stream) RecvRing() []byte { return s.recv }
func (s *Stream) RecvRingKey() (uint64, uint32) {
	return s.recvAddr, s.recvKey
}
func (s *Stream) Addrs() (local, remote netip.AddrPort) { return s.local, s.remote }

// PathProgress is the base link's: every stream of the group shares its
// path.
func (s *Stream) PathProgress() (sent, heard time.Time) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.m.sent, s.m.hear
}

func (s *Stream) closedError(op string) error {
	return fmt.Errorf("group: stream %#x: %s: %w", uint32(s.tag), op, net.ErrClosed)
}

func (s *Stream) misuse(format string, args ...any) error {
	return fmt.Errorf("group: stream %#x: %s: %w", uint32(s.tag), fmt.Sprintf(format, args...), link.ErrMisuse)
}

// PostSend queues the requests in the mux, which posts them in turn with
// the other streams'. All or none: a misuse posts nothing.
func (s *Stream) PostSend(wrs []link.SendWR) error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed {
		return s.closedError("PostSend")
	}
	controls := 0
	for i := range wrs {
		wr := &wrs[i]
		switch wr.Kind {
		case link.SendData:
			if uint64(wr.Off)+uint64(wr.N) > uint64(len(s.send)) {
				return s.misuse("PostSend: request %d: data [%d, %d) outside the %d-byte send ring",
					i, wr.Off, uint64(wr.Off)+uint64(wr.N), len(s.send))
			}
		case link.SendControl:
			if !wr.Signaled {
				return s.misuse("PostSend: request %d: unsignaled control", i)
			}
			if wire.StreamOf(&wr.Msg) != 0 {
				return s.misuse("PostSend: request %d: a control message with bytes 4-7 set, which name the stream", i)
			}
			controls++
		case link.SendMarker:
		default:
			return s.misuse("PostSend: request %d: kind %d", i, wr.Kind)
		}
	}
	if s.disconnecting || s.down || s.failing != nil {
		return nil // flushed, as on a queue pair in the error state
	}
	if out := s.seq - s.retired; out+uint64(len(wrs)) > uint64(s.caps.SendDepth) {
		return s.misuse("PostSend: %d requests outstanding and %d more, SendDepth %d", out, len(wrs), s.caps.SendDepth)
	}
	if len(s.controls)+controls > s.caps.ControlDepth {
		return s.misuse("PostSend: %d control requests outstanding and %d more, ControlDepth %d",
			len(s.controls), controls, s.caps.ControlDepth)
	}
	for _, wr := range wrs {
		s.seq++
		if wr.Kind == link.SendControl {
			s.controls = append(s.controls, s.seq)
		}
		if wr.Kind != link.SendControl && !s.remoteOK(wr.Remote, wr.RKey, dataLen(wr)) {
			s.failing = fmt.Errorf("group: stream %#x: %v request ID %d failed: %w: [%#x, +%d) with key %#x is in none of the peer's rings",
				uint32(s.tag), wr.Kind, wr.ID, link.ErrRemoteAccess, wr.Remote, dataLen(wr), wr.RKey)
			s.queued = append(s.queued, queuedWR{close: wire.ReasonRemoteAccess})
			m.queued++
			break
		}
		bw := wr
		switch wr.Kind {
		case link.SendData:
			bw.Ring, bw.Tag = s.sendKey, uint32(s.peer)
		case link.SendControl:
			wire.SetStream(&bw.Msg, s.peer)
		}
		s.queued = append(s.queued, queuedWR{wr: bw, seq: s.seq})
		m.queued++
	}
	m.stats.MostQueued = max(m.stats.MostQueued, m.queued)
	if !s.inReady && s.announced {
		s.inReady = true
		m.ready = append(m.ready, s)
	}
	m.pumpLocked()
	s.settleLocked()
	return nil
}

func dataLen(wr link.SendWR) uint32 {
	if wr.Kind == link.SendMarker {
		return 0
	}
	return wr.N
}

// remoteOK reports whether a write of n bytes at addr with rkey is inside
// a ring the peer announced.
func (s *Stream) remoteOK(addr uint64, rkey uint32, n uint32) bool {
	for _, r := range s.peerRings {
		if r.size == 0 || r.rkey != rkey || addr < r.addr {
			continue
		}
		if off := addr - r.addr; off <= uint64(r.size) && uint64(n) <= uint64(r.size)-off {
			return true
		}
	}
	return false
}

// ringMessage is an open or accept that offers the stream's receive ring.
func (s *Stream) ringMessage(op wire.Opcode, to wire.StreamTag) wire.GroupMessage {
	return wire.GroupMessage{Op: op, To: to, From: s.tag, Grant: uint16(s.m.cfg.FirstGrant),
		RingSize: uint32(len(s.recv)), RKey: s.recvKey, Addr: s.recvAddr}
}

// acceptedLocked opens the stream toward the peer's end of it.
func (s *Stream) acceptedLocked(g wire.GroupMessage) {
	s.state, s.peer, s.peerGrant = open, g.From, int(g.Grant)
	s.named = remoteRing{addr: g.Addr, size: g.RingSize, rkey: g.RKey}
	s.peerRings[0] = s.named
	s.nextRing = 1
}

// snoopLocked records a ring the peer's engine announces.
func (s *Stream) snoopLocked(msg *[wire.MessageSize]byte) {
	op := wire.Opcode(uint16(msg[0])<<8 | uint16(msg[1]))
	if op != wire.OpRegisterXferMemory && op != wire.OpRing {
		return
	}
	d, err := wire.Decode(msg[:], true)
	if err != nil {
		return // the engine says what is wrong with it
	}
	s.peerRings[s.nextRing] = remoteRing{addr: d.Addr, size: d.Length, rkey: d.RKey}
	s.nextRing = (s.nextRing + 1) % len(s.peerRings)
}

// settleLocked ends a failing stream once everything it posted before the
// failure completed (its SendDones come first, as a queue pair's do).
func (s *Stream) settleLocked() {
	if s.failing == nil || s.down || s.inflight > 0 || len(s.queued) > 0 {
		return
	}
	s.disconnecting = true
	s.terminateLocked(link.Completion{Kind: link.Failed, Err: s.failing})
}

// arriveLocked takes a message of the peer's for this stream: within its
// credit, or the stream fails (its peer overran the credit it was given).
func (s *Stream) arriveLocked(c link.Completion) {
	m := s.m
	if s.down || s.disconnecting {
		m.repostLocked(1)
		return
	}
	if s.avail == 0 {
		m.repostLocked(1)
		s.disconnecting = true
		m.dropQueuedLocked(s)
		s.terminateLocked(link.Completion{Kind: link.Failed, Err: fmt.Errorf("group: stream %#x: a message beyond the credit given: %w", uint32(s.tag), link.ErrRNR)})
		s.queued = []queuedWR{{close: wire.ReasonRNR}}
		m.queued++
		if !s.inReady {
			s.inReady = true
			m.ready = append(m.ready, s)
		}
		m.pumpLocked()
		return
	}
	s.avail--
	s.taken++
	s.pushLocked(c, 0)
}

// pushLocked queues a completion for Poll and ends a Wait if armed.
func (s *Stream) pushLocked(c link.Completion, seq uint64) {
	if s.down {
		return
	}
	s.cq = append(s.cq, entry{c: c, seq: seq})
	if s.armed {
		s.armed, s.event = false, true
		s.signalLocked()
	}
}

// terminateLocked queues the stream's last completion.
func (s *Stream) terminateLocked(c link.Completion) {
	if s.down || s.closed {
		s.down = true
		return
	}
	s.down = true
	s.cq = append(s.cq, entry{c: c})
	s.signalLocked()
}

func (s *Stream) signalLocked() {
	s.cond.Broadcast()
	if s.waits == 0 && s.notify != nil {
		s.notify()
	}
}

// PostRecv gives n receives the peer's messages took back to the group's
// pool; the credit the peer gets for them is Grant's.
func (s *Stream) PostRecv(n int) error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed {
		return s.closedError("PostRecv")
	}
	if n < 0 || n > s.taken {
		return s.misuse("PostRecv(%d) with %d taken", n, s.taken)
	}
	s.taken -= n
	m.granted -= n
	m.repostLocked(n)
	return nil
}

// Grant is the credit the stream's peer gets after n of its messages:
// what the pool has for it (link.PoolGrant), never less than leaves it
// its first grant, never more than MaxGrant.
func (s *Stream) Grant(held, n int) int {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || s.down {
		return n
	}
	g := link.PoolGrant(m.pool-m.granted, s.avail, n, m.cfg.FirstGrant, m.cfg.MaxGrant)
	s.avail += g
	m.granted += g
	return g
}

// Poll takes the stream's completions.
func (s *Stream) Poll(cs []link.Completion) (int, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed {
		return 0, s.closedError("Poll")
	}
	n := 0
	for n < len(cs) && n < len(s.cq) {
		e := s.cq[n]
		cs[n] = e.c
		n++
		if e.c.Kind == link.SendDone {
			s.retired = e.seq
			for len(s.controls) > 0 && s.controls[0] <= e.seq {
				s.controls = s.controls[1:]
			}
		}
	}
	clear(s.cq[copy(s.cq, s.cq[n:]):])
	s.cq = s.cq[:len(s.cq)-n]
	return n, nil
}

func (s *Stream) Arm() error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed {
		return s.closedError("Arm")
	}
	s.armed, s.event = true, false
	return nil
}

func (s *Stream) Wait() error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	s.waits++
	defer func() { s.waits-- }()
	for {
		switch {
		case s.closed:
			return s.closedError("Wait")
		case s.woken:
			s.woken = false
			return link.ErrWoken
		case s.event:
			s.event = false
			return nil
		case s.down:
			return nil
		}
		s.cond.Wait()
	}
}

func (s *Stream) Wake() {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	s.woken = true
	s.cond.Broadcast()
}

func (s *Stream) SetNotify(f func()) {
	m := s.m
	m.mu.Lock()
	s.notify = f
	m.mu.Unlock()
}

// Disconnect ends the stream at both sides: what it queued and the mux
// did not post is flushed, its Disconnected comes after what arrived, and
// the peer's after what this side posted before.
func (s *Stream) Disconnect() error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed {
		return s.closedError("Disconnect")
	}
	s.disconnectLocked()
	return nil
}

func (s *Stream) disconnectLocked() {
	if s.disconnecting {
		return
	}
	m := s.m
	// What landed comes before Disconnected, polled or not.
	m.drainLocked()
	if s.disconnecting {
		return
	}
	s.disconnecting = true
	m.dropQueuedLocked(s)
	s.terminateLocked(link.Completion{Kind: link.Disconnected})
	if !s.peerDone() && !s.closeSent && s.state == open && m.err == nil {
		s.closeSent = true
		m.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamClose, To: s.peer, From: s.tag})
	}
}

// Close ends the stream as Disconnect does, if it has not ended, and
// gives its slot and rings back once nothing of the peer's can land in
// them. A Wait in progress returns.
func (s *Stream) Close() error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed {
		return nil
	}
	s.disconnectLocked()
	s.closed = true
	s.cq = nil
	s.cond.Broadcast()
	m.maybeFreeLocked(s)
	return nil
}

// NewRecvRing makes a larger or smaller receive ring for the engine to
// offer the peer (link.Rings), from the base link.
func (s *Stream) NewRecvRing(size int) ([]byte, uint64, uint32, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || s.freed || m.err != nil {
		return nil, 0, 0, s.closedError("NewRecvRing")
	}
	mem, addr, rkey, err := m.base.NewRecvRing(size)
	if err == nil {
		s.grown = append(s.grown, mem)
	}
	return mem, addr, rkey, err
}

// ReleaseRecvRing gives back a receive ring nothing lands in any more.
func (s *Stream) ReleaseRecvRing(mem []byte) error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || s.freed || m.err != nil {
		return s.closedError("ReleaseRecvRing")
	}
	if !s.recvGone && link.SameRing(mem, s.recv) {
		s.recvGone = true
		return m.base.ReleaseRecvRing(mem)
	}
	for i, g := range s.grown {
		if link.SameRing(mem, g) {
			s.grown = append(s.grown[:i], s.grown[i+1:]...)
			return m.base.ReleaseRecvRing(mem)
		}
	}
	return s.misuse("ReleaseRecvRing: a ring of %d bytes the stream does not hold", len(mem))
}

// ReplaceSendRing replaces the transmit ring; no data request of the
// stream is outstanding, so none is in the mux or on the base link.
func (s *Stream) ReplaceSendRing(size int) ([]byte, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || s.freed || m.err != nil {
		return nil, s.closedError("ReplaceSendRing")
	}
	mem, key, err := m.base.NewSendRing(size)
	if err != nil {
		return nil, err
	}
	old := s.sendKey
	s.send, s.sendKey = mem, key
	return mem, m.base.ReleaseSendRing(old)
}

// releaseRingsLocked gives every ring of the stream back to the base link.
func (s *Stream) releaseRingsLocked() {
	b := s.m.base
	b.ReleaseSendRing(s.sendKey)
	if !s.recvGone {
		b.ReleaseRecvRing(s.recv)
	}
	for _, g := range s.grown {
		b.ReleaseRecvRing(g)
	}
	s.grown = nil
}
