package group

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Stream is one stream of a group: a link.Link whose requests the mux
// posts onto its base link and whose completions it hands over. Its peer
// holds credit for its messages (Caps.RecvCredit and RecvGrant). All its
// state is under the mux's lock.
type Stream struct {
	m         *Mux
	l         *baseLink      // the link it is on; nil while it waits for a move
	tag, peer wire.StreamTag // its name here, and at the peer
	// The stream's rings: its transmit ring, and its receive rings (the
	// first, until given back, then those it grew since: link.Rings).
	// recvMem is the first, which RecvRing names for the stream's life.
	send          streamRing
	recv          []streamRing
	recvMem       []byte
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

	queued        fifo[queuedWR]
	inReady       bool
	seq, retired  uint64       // requests posted, and retired by SendDones taken
	controls      fifo[uint64] // seqs of control requests outstanding
	inflight      int          // requests on the base link
	avail         int          // credit the peer holds: messages it may still send
	taken         int          // receives the peer's messages took, not yet posted again
	disconnecting bool         // no more requests go
	closeSent     bool         // this side sent StreamClose
	peerClosed    bool         // the peer sent StreamClose (or refused the open)
	closeAnswered bool         // the peer answered this side's StreamClose
	closed        bool
	freed         bool
	failing       error // a request failed here: the stream fails once what went before completes

	// Moves (move.go): a stream waiting for a link (waiting, since
	// suspendedAt, for cause), moving to one (its StreamMove unanswered),
	// with a StreamClose to send once it is on one (closeDue). fails and
	// resumes count the Failed and Resumed completions of its moves, and
	// tookResumes the Resumeds its engine polled.
	waiting, moving, closeDue bool
	// A stream leaving a link that works (rebalance.go) waits there for
	// its requests to complete, then goes to leaveTo; at the peer of the
	// group's dialer, to answer leaveAsk there.
	leaving                     bool
	leaveTo                     *baseLink
	leaveAsk                    *wire.GroupMessage
	leaveTimer                  *time.Timer
	suspendedAt                 time.Time
	cause                       error
	fails, resumes, tookResumes uint32

	cq    []entry
	down  bool // the terminal completion was queued
	armed bool
	event bool
	woken bool
	// justArmed: no Poll since the last Arm
	justArmed bool
	waits     int
	notify    func()
	cond      sync.Cond // on the mux's lock
	// signalQueued: a leader's or a service's drain queued the stream's
	// signal, to be given once it let go of the mux's lock.
	signalQueued bool
	// Its Wait (or its opener) leads on leads (sleeps in its base link's
	// Wait), or follows on following (asleep on cond, at followIdx in its
	// followers); scratch is its signals to give as a leader.
	leads, following *baseLink
	followIdx        int
	scratch          []wakeup
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

// streamRing is one of a stream's rings: memory the link that made it
// holds (regs[0]), registered on each link the stream moved to since.
type streamRing struct {
	mem  []byte
	regs []ringReg
}

// ringReg is a ring's registration on one link.
type ringReg struct {
	on   *baseLink
	addr uint64 // a receive ring's address there
	key  uint32 // its rkey there, or a transmit ring's key
}

// regOn is the ring's registration on l, or nil.
func (r *streamRing) regOn(l *baseLink) *ringReg {
	for i := range r.regs {
		if r.regs[i].on == l {
			return &r.regs[i]
		}
	}
	return nil
}

// release gives the ring back: its registrations on the links it moved
// to, then its memory to the link that made it.
func (r *streamRing) release(send bool) {
	for i := len(r.regs) - 1; i >= 0; i-- {
		g := r.regs[i]
		if send {
			g.on.base.ReleaseSendRing(g.key)
		} else {
			g.on.base.ReleaseRecvRing(r.mem)
		}
		g.on.regs--
		g.on.maybeCloseLocked()
	}
	r.regs = nil
}

// unshare drops the ring's registration on l, unless l made it (it holds
// the memory): the stream left l, and nothing of it lands there or is
// read from there any more (its requests there completed, or l failed
// and was disconnected).
func (r *streamRing) unshare(l *baseLink, send bool) {
	for i := 1; i < len(r.regs); i++ {
		if g := r.regs[i]; g.on == l {
			if send {
				l.base.ReleaseSendRing(g.key)
			} else {
				l.base.ReleaseRecvRing(r.mem)
			}
			l.regs--
			r.regs = slices.Delete(r.regs, i, i+1)
			return
		}
	}
}

// unshareRingsLocked drops the stream's registrations on l, which it
// left, so that a link that failed, or a TCP link retired, closes once
// the streams that only passed through it left (only a link that made a
// stream's ring waits for the stream's end).
func (s *Stream) unshareRingsLocked(l *baseLink) {
	s.send.unshare(l, true)
	for i := range s.recv {
		s.recv[i].unshare(l, false)
	}
	l.maybeCloseLocked()
}

// share registers the ring on l, if it is not yet.
func (r *streamRing) share(l *baseLink, send bool) error {
	if r.regOn(l) != nil {
		return nil
	}
	g := ringReg{on: l}
	maker := r.regs[0].on.base
	var err error
	if send {
		g.key, err = l.base.ShareSendRing(maker, r.mem)
	} else {
		g.addr, g.key, err = l.base.ShareRecvRing(maker, r.mem)
	}
	if err != nil {
		return err
	}
	l.regs++
	r.regs = append(r.regs, g)
	return nil
}

// shareRingsLocked registers every ring of the stream on l.
func (s *Stream) shareRingsLocked(l *baseLink) error {
	if err := s.send.share(l, true); err != nil {
		return err
	}
	for i := range s.recv {
		if err := s.recv[i].share(l, false); err != nil {
			return err
		}
	}
	return nil
}

var (
	_ link.Link          = (*Stream)(nil)
	_ link.RecvGranter   = (*Stream)(nil)
	_ link.PathWatcher   = (*Stream)(nil)
	_ link.Rings         = (*Stream)(nil)
	_ link.PeerRingNamer = (*Stream)(nil)
	_ link.Resumer       = (*Stream)(nil)
	_ link.RingKeyer     = (*Stream)(nil)
)

// peerDone reports whether nothing more of the peer's lands on the stream:
// it sent StreamClose, or answered this side's.
func (s *Stream) peerDone() bool { return s.peerClosed || s.closeAnswered }

// settledLocked reports whether both sides let go of the stream: nothing
// of the peer's lands on it, and no StreamClose of this side's waits for
// its answer.
func (s *Stream) settledLocked() bool { return s.peerDone() && (!s.closeSent || s.closeAnswered) }

// Moves reports whether the stream moves when its link fails
// (Config.MoveTimeout): its engine must be resumable.
func (s *Stream) Moves() bool { return s.m.cfg.MoveTimeout > 0 }

// Features are the features the group's sides agreed on for the streams'
// engines (Config.Features).
func (s *Stream) Features() wire.Features { return s.m.cfg.Features }

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

// Base is the link the stream is on (or was last).
func (s *Stream) Base() link.Link {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.l != nil {
		return s.l.base
	}
	if len(s.send.regs) > 0 {
		return s.send.regs[len(s.send.regs)-1].on.base
	}
	return nil
}

// Tag is the stream's name at this side, for diagnostics.
func (s *Stream) Tag() wire.StreamTag { return s.tag }

func (s *Stream) Caps() link.Caps  { return s.caps }
func (s *Stream) SendRing() []byte { return s.send.mem }
func (s *Stream) RecvRing() []byte { return s.recvMem }

// RecvRingKey names the first receive ring on the link the stream is on
// now: a stream that moved announces it again (stream.Engine.Relink).
func (s *Stream) RecvRingKey() (uint64, uint32) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.recvKeyLocked()
}

// RingKey names a receive ring of the stream's on the link it is on now
// (link.RingKeyer).
func (s *Stream) RingKey(mem []byte) (uint64, uint32, bool) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if i := s.recvIndexLocked(mem); i >= 0 {
		if g := s.recv[i].regOn(s.l); g != nil {
			return g.addr, g.key, true
		}
	}
	return 0, 0, false
}

// recvIndexLocked is where mem is among the stream's receive rings, or -1.
func (s *Stream) recvIndexLocked(mem []byte) int {
	for i := range s.recv {
		if link.SameRing(s.recv[i].mem, mem) {
			return i
		}
	}
	return -1
}

// recvKeyLocked names the first receive ring on the stream's link, or on
// the last it was on while it has none (0 once given back).
func (s *Stream) recvKeyLocked() (uint64, uint32) {
	if len(s.recv) == 0 || !link.SameRing(s.recv[0].mem, s.recvMem) || len(s.recv[0].regs) == 0 {
		return 0, 0
	}
	r := &s.recv[0]
	g := r.regOn(s.l)
	if g == nil {
		g = &r.regs[len(r.regs)-1]
	}
	return g.addr, g.key
}

func (s *Stream) Addrs() (local, remote netip.AddrPort) { return s.local, s.remote }

// PathProgress is the base link's: every stream of the group shares its
// path.
func (s *Stream) PathProgress() (sent, heard time.Time) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.l == nil {
		return time.Time{}, time.Time{}
	}
	return s.l.sent, s.l.hear
}

func (s *Stream) closedError(op string) error {
	return fmt.Errorf("group: stream %#x: %s: %w", uint32(s.tag), op, net.ErrClosed)
}

func (s *Stream) misuse(format string, args ...any) error {
	return fmt.Errorf("group: stream %#x: %s: %w", uint32(s.tag), fmt.Sprintf(format, args...), link.ErrMisuse)
}

// RegisterMem registers m with the base link the stream is on now
// (link.MemSender). A stream that moves later sends from m on its new
// link, which registers it at its first request if it must.
func (s *Stream) RegisterMem(mem *link.Mem) error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || s.l == nil {
		return s.closedError("RegisterMem")
	}
	if b, ok := s.l.base.(link.MemSender); ok {
		return b.RegisterMem(mem)
	}
	return s.misuse("RegisterMem: link %s cannot send from registered memory", s.l.bc.Name)
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
			if wr.Mem != nil {
				if uint64(wr.Off)+uint64(wr.N) > uint64(len(wr.Mem.Bytes())) {
					return s.misuse("PostSend: request %d: data [%d, %d) outside the %d bytes of registered memory",
						i, wr.Off, uint64(wr.Off)+uint64(wr.N), len(wr.Mem.Bytes()))
				}
			} else if uint64(wr.Off)+uint64(wr.N) > uint64(len(s.send.mem)) {
				return s.misuse("PostSend: request %d: data [%d, %d) outside the %d-byte send ring",
					i, wr.Off, uint64(wr.Off)+uint64(wr.N), len(s.send.mem))
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
	if s.disconnecting || s.down || s.failing != nil || s.staleLocked() {
		return nil // flushed, as on a queue pair in the error state (or a link the stream left)
	}
	l := s.l
	if out := s.seq - s.retired; out+uint64(len(wrs)) > uint64(s.caps.SendDepth) {
		return s.misuse("PostSend: %d requests outstanding and %d more, SendDepth %d", out, len(wrs), s.caps.SendDepth)
	}
	if s.controls.len()+controls > s.caps.ControlDepth {
		return s.misuse("PostSend: %d control requests outstanding and %d more, ControlDepth %d",
			s.controls.len(), controls, s.caps.ControlDepth)
	}
	for _, wr := range wrs {
		s.seq++
		if wr.Kind == link.SendControl {
			s.controls.push(s.seq)
		}
		if wr.Kind != link.SendControl && !s.remoteOK(wr.Remote, wr.RKey, dataLen(wr)) {
			s.failing = fmt.Errorf("group: stream %#x: %v request ID %d failed: %w: [%#x, +%d) with key %#x is in none of the peer's rings",
				uint32(s.tag), wr.Kind, wr.ID, link.ErrRemoteAccess, wr.Remote, dataLen(wr), wr.RKey)
			s.queued.push(queuedWR{close: wire.ReasonRemoteAccess})
			l.queued++
			break
		}
		bw := wr
		switch wr.Kind {
		case link.SendData:
			bw.Ring, bw.Tag = s.send.regOn(l).key, uint32(s.peer)
		case link.SendControl:
			wire.SetStream(&bw.Msg, s.peer)
		}
		s.queued.push(queuedWR{wr: bw, seq: s.seq})
		l.queued++
	}
	l.mostQueued = max(l.mostQueued, l.queued)
	l.readyLocked(s)
	l.pumpLocked()
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
	addr, rkey := s.recvKeyLocked()
	return wire.GroupMessage{Op: op, To: to, From: s.tag, Grant: uint16(s.m.cfg.FirstGrant),
		RingSize: uint32(len(s.recvMem)), RKey: rkey, Addr: addr}
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
	if s.failing == nil || s.down || s.inflight > 0 || s.queued.len() > 0 {
		return
	}
	s.disconnecting = true
	s.terminateLocked(link.Completion{Kind: link.Failed, Err: s.failing})
}

// arriveLocked takes a message of the peer's for this stream: within its
// credit, or the stream fails (its peer overran the credit it was given).
func (s *Stream) arriveLocked(c link.Completion) {
	l := s.l
	if s.down || s.disconnecting {
		l.repostLocked(1)
		return
	}
	if s.avail == 0 {
		l.repostLocked(1)
		s.disconnecting = true
		s.dropQueuedLocked()
		s.terminateLocked(link.Completion{Kind: link.Failed, Err: fmt.Errorf("group: stream %#x: a message beyond the credit given: %w", uint32(s.tag), link.ErrRNR)})
		s.queued.reset()
		s.queued.push(queuedWR{close: wire.ReasonRNR})
		l.queued++
		l.readyLocked(s)
		l.pumpLocked()
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
		s.setArmedLocked(false)
		s.event = true
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
	s.wakeLeaderLocked()
	if d := s.m.deferTo; d != nil {
		if !s.signalQueued {
			s.signalQueued = true
			d.signals = append(d.signals, s)
		}
		return
	}
	s.cond.Broadcast()
	if s.waits == 0 && s.notify != nil {
		s.notify()
	}
}

// openedLocked tells the stream's opener that its open was answered (or
// will not be).
func (s *Stream) openedLocked() {
	close(s.opened)
	s.wakeLeaderLocked()
}

// wakeLeaderLocked wakes the stream's Wait (or its opener) where it
// sleeps in a base link's Wait, as a leader: its cond wakes only a
// follower.
func (s *Stream) wakeLeaderLocked() {
	if l := s.leads; l != nil && l.asleep {
		l.base.Wake()
	}
}

// wakeup is a stream's signal given after the mux's lock was let go.
type wakeup struct {
	cond   *sync.Cond // nil: nobody waits
	notify func()     // nil: somebody waits, or nobody is to be told
}

// takeSignalsLocked ends the deferral of the streams' signals that l's
// drain began, and says in ws what to give once the lock is let go: a
// reader woken while the drain holds the lock would only wait for the
// lock, and be woken again when it is free (two wake-ups for one
// completion).
func (l *baseLink) takeSignalsLocked(ws []wakeup) []wakeup {
	l.m.deferTo = nil
	for i, s := range l.signals {
		s.signalQueued = false
		w := wakeup{}
		if s.waits > 0 {
			w.cond = &s.cond
		} else if s.notify != nil {
			w.notify = s.notify
		}
		ws = append(ws, w)
		l.signals[i] = nil
	}
	l.signals = l.signals[:0]
	return ws
}

// give wakes the streams takeSignalsLocked named, with no lock held, and
// returns ws emptied, to be used again.
func give(ws []wakeup) []wakeup {
	for i, w := range ws {
		if w.cond != nil {
			w.cond.Broadcast()
		}
		if w.notify != nil {
			w.notify()
		}
		ws[i] = wakeup{}
	}
	return ws[:0]
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
	if s.staleLocked() {
		return nil // receives of a link the stream left
	}
	if n < 0 || n > s.taken {
		return s.misuse("PostRecv(%d) with %d taken", n, s.taken)
	}
	s.taken -= n
	if l := s.l; l != nil {
		l.granted -= n
		l.repostLocked(n)
		l.receivesFreedLocked()
	}
	return nil
}

// Grant is the credit the stream's peer gets after n of its messages:
// what the pool has for it (link.PoolGrant), never less than leaves it
// its first grant, never more than MaxGrant.
func (s *Stream) Grant(held, n int) int {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	l := s.l
	if s.closed || s.down || l == nil || s.staleLocked() {
		return n
	}
	g := link.PoolGrant(m.freeLocked(l), s.avail, n, m.cfg.FirstGrant, m.cfg.MaxGrant)
	s.avail += g
	l.granted += g
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
	if len(s.cq) == 0 && s.l != nil && !s.justArmed {
		// Take what the base link has, rather than wait for a leader or a
		// service to hand it over: a Read that polls before it sleeps
		// (adaptive polling, connfd) finds its answer with no wake-up.
		// The poll that follows an Arm need not: the base link is armed
		// whenever nobody drains it, or one of its streams' Arm would
		// arm it, so what comes raises an event, and a Wait that follows
		// leads and drains it first.
		s.l.polled = true
		s.l.drainLocked(false)
	}
	s.justArmed = false
	n := 0
	for n < len(cs) && n < len(s.cq) {
		e := s.cq[n]
		cs[n] = e.c
		n++
		switch e.c.Kind {
		case link.SendDone:
			s.retired = e.seq
			for s.controls.len() > 0 && *s.controls.front() <= e.seq {
				s.controls.pop()
			}
		case link.Resumed:
			// The engine starts afresh on the new link: nothing of the
			// old one is outstanding.
			s.tookResumes++
			s.retired = s.seq
			s.controls.reset()
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
	s.setArmedLocked(true)
	s.event, s.justArmed = false, true
	if l := s.l; l != nil && l.resting {
		// Its streams polled it: what came since raised no event.
		l.settleLocked()
	}
	return nil
}

// joinLinkLocked puts the stream on l, counted among its armed streams if
// it is armed (a stream may Arm while suspended); leaveLinkLocked takes it
// off.
func (s *Stream) joinLinkLocked(l *baseLink) {
	s.l = l
	if s.armed {
		l.armedStreams++
	}
}

// leaveLinkLocked takes the stream off s.l's count of armed streams and
// off the link.
func (s *Stream) leaveLinkLocked() {
	if s.armed && s.l != nil {
		s.l.armedStreams--
	}
	s.l = nil
}

// setArmedLocked sets armed, and counts the stream among its link's
// armedStreams while it is (restLocked).
func (s *Stream) setArmedLocked(armed bool) {
	if s.armed == armed {
		return
	}
	s.armed = armed
	if l := s.l; l != nil {
		if armed {
			l.armedStreams++
		} else {
			l.armedStreams--
		}
	}
}

// Wait sleeps until the stream's Arm is answered, it is woken, or it
// ends. The first Wait on a base link leads (leadLocked); the others sleep
// on their cond until a completion, the leader or kick's service wakes
// them.
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
		if l := s.l; l != nil && l.leadableLocked() {
			s.leadLocked(l)
			continue
		}
		s.followLocked()
	}
}

// readyLocked reports whether a Wait has something to return for.
func (s *Stream) readyLocked() bool { return s.closed || s.woken || s.event || s.down }

// leadLocked is Wait as its base link's leader (baseLink.leadLocked):
// until the stream has something to return for, or moved.
func (s *Stream) leadLocked(l *baseLink) {
	s.leads = l
	l.leadLocked(func() bool { return s.readyLocked() || s.l != l }, false, &s.scratch)
	s.leads = nil
}

// followLocked sleeps on the stream's cond, as one that may lead its link
// next (handLeadLocked).
func (s *Stream) followLocked() {
	if l := s.l; l != nil {
		s.following, s.followIdx = l, len(l.followers)
		l.followers = append(l.followers, s)
		if l.yields && l.asleep {
			l.base.Wake() // an Open or an Accept leads: it hands over
		}
	}
	s.cond.Wait()
	s.unfollowLocked()
}

// unfollowLocked takes the stream out of its link's followers.
func (s *Stream) unfollowLocked() {
	l := s.following
	if l == nil {
		return
	}
	last := len(l.followers) - 1
	moved := l.followers[last]
	l.followers[s.followIdx], moved.followIdx = moved, s.followIdx
	l.followers[last] = nil
	l.followers = l.followers[:last]
	s.following = nil
}

func (s *Stream) Wake() {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	s.woken = true
	s.cond.Broadcast()
	s.wakeLeaderLocked()
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
	if s.l != nil {
		s.l.drainLocked(true)
	}
	if s.disconnecting {
		return
	}
	s.disconnecting = true
	s.dropQueuedLocked()
	s.terminateLocked(link.Completion{Kind: link.Disconnected})
	if s.peerDone() || s.closeSent || s.state != open || m.err != nil {
		return
	}
	if s.l == nil || s.moving || s.leaving {
		s.closeDue = true // once it is on a link again
		return
	}
	s.closeSent = true
	s.l.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamClose, To: s.peer, From: s.tag})
}

// dropQueuedLocked flushes what the stream queued and its link did not
// post.
func (s *Stream) dropQueuedLocked() {
	if s.l != nil {
		s.l.queued -= s.queued.len()
	}
	s.queued.reset()
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
	s.wakeLeaderLocked()
	m.maybeFreeLocked(s)
	return nil
}

// NewRecvRing makes a larger or smaller receive ring for the engine to
// offer the peer (link.Rings), on the link the stream is on.
func (s *Stream) NewRecvRing(size int) ([]byte, uint64, uint32, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || s.freed || m.err != nil || s.l == nil {
		return nil, 0, 0, s.closedError("NewRecvRing")
	}
	l := s.l
	mem, addr, rkey, err := l.base.NewRecvRing(size)
	if err == nil {
		l.regs++
		s.recv = append(s.recv, streamRing{mem: mem, regs: []ringReg{{on: l, addr: addr, key: rkey}}})
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
	if i := s.recvIndexLocked(mem); i >= 0 {
		s.recv[i].release(false)
		s.recv = append(s.recv[:i], s.recv[i+1:]...)
		return nil
	}
	return s.misuse("ReleaseRecvRing: a ring of %d bytes the stream does not hold", len(mem))
}

// ReplaceSendRing replaces the transmit ring; no data request of the
// stream is outstanding, so none is in the mux or on the base link.
func (s *Stream) ReplaceSendRing(size int) ([]byte, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.closed || s.freed || m.err != nil || s.l == nil {
		return nil, s.closedError("ReplaceSendRing")
	}
	l := s.l
	mem, key, err := l.base.NewSendRing(size)
	if err != nil {
		return nil, err
	}
	l.regs++
	old := s.send
	s.send = streamRing{mem: mem, regs: []ringReg{{on: l, key: key}}}
	old.release(true)
	return mem, nil
}

// releaseRingsLocked gives every ring of the stream back.
func (s *Stream) releaseRingsLocked() {
	s.send.release(true)
	for i := range s.recv {
		s.recv[i].release(false)
	}
	s.recv = nil
}
