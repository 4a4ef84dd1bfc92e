package group

import (
	"fmt"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Moving streams between a group's links (Config.MoveTimeout;
// docs/protocol.md, "Link groups", moves).
//
// A link that fails suspends its streams: each reports a Failed completion
// that matches link.ErrDown, which a resumable engine (wire.FeatureResume)
// takes for a lost link, and the stream drops what its engine posts until
// the engine took the link.Resumed that ends the suspension. The dialer of
// the group (Config.Mover) moves each suspended stream to the link with
// the fewest streams: it registers the stream's rings there (the same
// memory: link.Carrier's ShareSendRing and ShareRecvRing) and sends
// StreamMove on it. The peer, which drops the failed link if it had not
// found it failed yet, registers its rings there too and answers
// StreamMoved; each side then reports link.Resumed, and the engines say
// what they received and send the rest again (Resume). The stream's tag
// is the group's, not the link's, so nothing else changes.
//
// Late completions of the failed link for a stream that moved are dropped:
// its writes landed in the same places as the bytes sent again do. A
// stream that finds no link within MoveTimeout ends (link.Ended, a
// *MoveError), and a group with no link then ends too.

// MoveError ends a stream that could not move to another link of its group
// within Config.MoveTimeout, or whose move the peer refused.
type MoveError struct {
	Cause  error         // what broke the link it was on
	Waited time.Duration // how long it waited
	Reason uint32        // the peer's refusal, if it refused (wire.Reason...)
}

func (e *MoveError) Error() string {
	if e.Reason != 0 {
		return fmt.Sprintf("group: the stream could not move to another link (%s) after %v", reasonText(e.Reason), e.Cause)
	}
	return fmt.Sprintf("group: no link took the stream in %v after %v", e.Waited.Round(time.Millisecond), e.Cause)
}

func (e *MoveError) Unwrap() error { return e.Cause }

// movingError is a suspended stream's Failed completion: its link failed
// (cause), and it waits for another.
func movingError(l *baseLink, cause error) error {
	return fmt.Errorf("group: %s failed, the stream moves to another link: %w: %w", l.name(), link.ErrDown, cause)
}

// detachLocked takes the stream off its link, which works on: the credit
// its peer held there and the receives its messages took go back to the
// link's pool.
func (s *Stream) detachLocked() {
	l := s.l
	if l == nil {
		return
	}
	l.granted -= s.avail + s.taken
	l.repostLocked(s.taken)
	l.streams--
	l.unreadyLocked(s)
	s.leaveLinkLocked()
	s.avail, s.taken = 0, 0
	s.unshareRingsLocked(l)
	l.receivesFreedLocked()
}

// suspendLocked takes the stream off its link, which failed (cause):
// an open in flight fails; an open stream waits for a move.
func (s *Stream) suspendLocked(cause error) {
	m, l := s.m, s.l
	s.dropQueuedLocked()
	s.inReady = false
	l.streams--
	s.leaveLinkLocked()
	s.unshareRingsLocked(l)
	s.inflight = 0
	s.avail, s.taken = 0, 0
	s.announced = false
	s.peerRings, s.nextRing = [3]remoteRing{}, 0
	if s.state == opening {
		// Its StreamOpen may not have arrived: the opener tries again,
		// in this group if another link works.
		s.state, s.openErr = refused, fmt.Errorf("%w: %w", ErrOpenLost, cause)
		s.peerClosed = true
		s.openedLocked()
		if s.abandoned {
			s.closed = true
		}
		m.maybeFreeLocked(s)
		return
	}
	if s.settledLocked() {
		// Both sides let go of it; it waits only for its Close here.
		m.maybeFreeLocked(s)
		return
	}
	if s.closeSent && !s.closeAnswered {
		// Its StreamClose may be lost with the link: it goes again there.
		s.closeSent, s.closeDue = false, true
	}
	s.suspendedAt = time.Now()
	s.cause = cause
	m.suspended = append(m.suspended, s)
	s.waiting = true
	if !s.down && !s.disconnecting && !s.lostLocked() {
		s.fails++
		s.pushLocked(link.Completion{Kind: link.Failed, Err: movingError(l, cause)}, 0)
		s.signalLocked()
	}
}

// lostLocked reports whether the stream's engine has a Failed of a move
// that no Resumed answered yet.
func (s *Stream) lostLocked() bool { return s.fails > s.resumes }

// staleLocked reports whether what the engine posts now is for a link the
// stream left: it has not yet taken the Resumed of its last move.
func (s *Stream) staleLocked() bool { return s.fails > s.tookResumes }

// errPeerLeft ends a group whose peer disconnected its last link and did
// not come back within PeerLeftWait.
var errPeerLeft = disconnected{fmt.Errorf("%w: the peer disconnected the group's last link and did not come back", ErrDown)}

// afterLinkDownLocked moves the suspended streams (the Mover), answers
// the moves that waited for streams to leave the failed link (its peer),
// and sets the deadline of those that wait: a peer that disconnected the
// last link has PeerLeftWait to come back.
func (m *Mux) afterLinkDownLocked(err error) {
	m.lastDown = err
	if m.endIfEmptyLocked(err) {
		return
	}
	if !m.cfg.Mover && m.cfg.PeerLeftWait > 0 && Disconnected(err) && !m.liveLocked() {
		armTimer(&m.leftTimer, m.cfg.PeerLeftWait, m.peerLeftDeadline)
	}
	if m.cfg.Mover {
		m.moveSuspendedLocked()
	}
	for _, l := range m.links {
		if l.err == nil && len(l.movesWaiting) > 0 {
			l.receivesFreedLocked()
		}
	}
	m.armMoveTimerLocked()
}

// moveSuspendedLocked moves every suspended stream that a link has room
// for, oldest first.
func (m *Mux) moveSuspendedLocked() {
	for len(m.suspended) > 0 {
		to := m.pickMoveLocked()
		if to == nil {
			return
		}
		s := m.suspended[0]
		m.suspended = m.suspended[1:]
		s.waiting = false
		m.moveLocked(s, to, wire.ReasonNone)
	}
}

// pickMoveLocked is the link with the fewest streams that works and has
// receives for a stream's first grant: a TCP link only if no other does.
func (m *Mux) pickMoveLocked() *baseLink {
	var best *baseLink
	for _, l := range m.links {
		if l.err != nil || !l.roomToMoveLocked() {
			continue
		}
		if best == nil || best.lastResort && !l.lastResort || best.lastResort == l.lastResort && l.streams < best.streams {
			best = l
		}
	}
	return best
}

// roomToMoveLocked reports whether a stream that moves to l has its first
// grant there now. The group keeps room for it (reserveLocked), but a
// stream's credit is granted again before its receives are posted again,
// so the room may be a moment away: the move waits for it
// (receivesFreedLocked).
func (l *baseLink) roomToMoveLocked() bool { return l.granted+l.m.cfg.FirstGrant <= l.pool }

// receivesFreedLocked: receives of l's pool came back; moves that waited
// for them go on.
func (l *baseLink) receivesFreedLocked() {
	m := l.m
	if m.err != nil || l.err != nil {
		return
	}
	for len(l.movesWaiting) > 0 && l.roomToMoveLocked() {
		g := l.movesWaiting[0]
		l.movesWaiting = l.movesWaiting[1:]
		l.takeMoveLocked(g)
	}
	if m.cfg.Mover && len(m.suspended) > 0 {
		m.moveSuspendedLocked()
	}
}

// attachLocked puts a suspended stream on l: its rings registered there
// and its peer's first grant of l's receives. It fails (the reason to
// give the peer) if l has neither.
func (s *Stream) attachLocked(l *baseLink) uint32 {
	if !l.roomToMoveLocked() {
		return wire.ReasonLimit
	}
	if err := s.shareRingsLocked(l); err != nil {
		return wire.ReasonMemory
	}
	s.joinLinkLocked(l)
	l.streams++
	s.avail = s.m.cfg.FirstGrant
	l.granted += s.avail
	return wire.ReasonNone
}

// moveLocked moves a suspended stream to l (the Mover's side): StreamMove
// goes there, and the stream resumes on its answer.
func (m *Mux) moveLocked(s *Stream, to *baseLink, reason uint32) {
	if r := s.attachLocked(to); r != wire.ReasonNone {
		s.moveFailedLocked(&MoveError{Cause: s.cause, Waited: time.Since(s.suspendedAt), Reason: r})
		return
	}
	s.moving = true
	to.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamMove, To: s.peer, From: s.tag, Grant: uint16(s.avail), Reason: reason})
}

// moveAskedLocked takes the Mover's StreamMove on l.
func (m *Mux) moveAskedLocked(l *baseLink, g wire.GroupMessage) {
	switch {
	case m.cfg.Mover:
		m.protocolLocked(l, fmt.Errorf("StreamMove to the group's dialer"))
		return
	case m.cfg.MoveTimeout <= 0:
		m.protocolLocked(l, fmt.Errorf("StreamMove in a group that does not move streams"))
		return
	}
	s, err := m.streamLocked(g.To)
	if err != nil || s.freed {
		movedRefusal(l, g, wire.ReasonGone) // it ended here meanwhile (its move came too late)
		return
	}
	if s.peer != g.From || s.state != open || s.l == l || s.moving || len(l.movesWaiting) >= groupRequests {
		m.protocolLocked(l, fmt.Errorf("StreamMove of %#x from %#x, which is not the peer's stream to move here", uint32(g.To), uint32(g.From)))
		return
	}
	if s.l != nil && g.Reason == wire.MoveRebalance {
		m.rebalanceAskedLocked(l, s, g)
		return
	}
	if old := s.l; old != nil {
		// The dialer found the stream's link failed before this side did.
		old.downLocked(fmt.Errorf("%w: the peer moved its streams off %s", ErrDown, old.name()))
		if m.err != nil {
			return
		}
	}
	l.takeOrQueueMoveLocked(g)
}

// takeOrQueueMoveLocked takes a StreamMove now, or once l's receives
// come back (roomToMoveLocked) and the moves before it were taken: moves
// keep their order. At most groupRequests wait: they are requests.
func (l *baseLink) takeOrQueueMoveLocked(g wire.GroupMessage) {
	if len(l.movesWaiting) > 0 || !l.roomToMoveLocked() {
		l.movesWaiting = append(l.movesWaiting, g)
		return
	}
	l.takeMoveLocked(g)
}

// takeMoveLocked moves the stream a StreamMove names onto l and answers.
func (l *baseLink) takeMoveLocked(g wire.GroupMessage) {
	m := l.m
	s, err := m.streamLocked(g.To)
	if err != nil || s.freed || s.l != nil || !s.waiting {
		movedRefusal(l, g, wire.ReasonGone)
		return
	}
	m.dropSuspendedLocked(s)
	if r := s.attachLocked(l); r != wire.ReasonNone {
		movedRefusal(l, g, r)
		s.moveFailedLocked(&MoveError{Cause: s.cause, Waited: time.Since(s.suspendedAt), Reason: r})
		return
	}
	s.peerGrant = int(g.Grant)
	l.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamMoved, To: s.peer, From: s.tag, Grant: uint16(s.avail)})
	s.resumedLocked()
}

// movedRefusal answers a StreamMove with why the stream did not move.
func movedRefusal(l *baseLink, g wire.GroupMessage, reason uint32) {
	l.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamMoved, To: g.From, Reason: reason})
}

// movedLocked takes the peer's StreamMoved on l (the Mover's side).
func (m *Mux) movedLocked(l *baseLink, g wire.GroupMessage) {
	s, err := m.streamLocked(g.To)
	if err != nil || !s.moving || s.l != l || g.Reason == wire.ReasonNone && s.peer != g.From {
		m.protocolLocked(l, fmt.Errorf("StreamMoved for %#x, which moves nothing here", uint32(g.To)))
		return
	}
	s.moving = false
	if g.Reason != wire.ReasonNone {
		s.moveFailedLocked(&MoveError{Cause: s.cause, Waited: time.Since(s.suspendedAt), Reason: g.Reason})
		return
	}
	s.peerGrant = int(g.Grant)
	s.announced = true
	s.resumedLocked()
	l.readyLocked(s)
	m.retireLastResortLocked()
	m.balanceLocked()
}

// resumedLocked ends a stream's suspension on its new link: its engine
// takes link.Resumed, and a StreamClose that its link's failure kept
// goes now.
func (s *Stream) resumedLocked() {
	m := s.m
	kind := MoveFailover
	if s.cause == errRebalance {
		kind = MoveRebalance
	}
	m.countMoveLocked(kind)
	if s.lostLocked() {
		s.resumes++
		s.pushLocked(link.Completion{Kind: link.Resumed}, 0)
		s.signalLocked()
	}
	if s.closeDue && !s.peerDone() {
		s.closeDue = false
		s.closeSent = true
		s.l.sendGroupLocked(wire.GroupMessage{Op: wire.OpStreamClose, To: s.peer, From: s.tag})
	}
	m.maybeFreeLocked(s)
}

// countMoveLocked counts a stream's move (Stats, Config.OnMove).
func (m *Mux) countMoveLocked(k MoveKind) {
	if k == MoveFailed {
		m.stats.MovesFailed++
	} else {
		m.stats.Moved++
	}
	if m.cfg.OnMove != nil {
		m.cfg.OnMove(k)
	}
}

// moveFailedLocked ends a stream that could not move: its engine takes
// link.Ended with err, and nothing more of the peer's comes for it.
func (s *Stream) moveFailedLocked(err *MoveError) {
	m := s.m
	m.countMoveLocked(MoveFailed)
	m.dropSuspendedLocked(s)
	s.detachLocked()
	s.moving = false
	s.endedLocked(err)
	m.maybeFreeLocked(s)
}

// endedLocked ends a suspended stream for good: Ended (its engine waits
// for a move, and takes no other end), and nothing of the peer's lands
// any more.
func (s *Stream) endedLocked(err error) {
	s.peerClosed, s.closeDue = true, false
	if s.closeSent {
		s.closeAnswered = true
	}
	s.disconnecting = true
	if s.lostLocked() && !s.down {
		s.down = true
		s.cq = append(s.cq, entry{c: link.Completion{Kind: link.Ended, Err: err}})
		s.signalLocked()
		return
	}
	s.terminateLocked(link.Completion{Kind: link.Failed, Err: err})
}

// dropSuspendedLocked takes s off the streams that wait for a move.
func (m *Mux) dropSuspendedLocked(s *Stream) {
	if !s.waiting {
		return
	}
	s.waiting = false
	for i, x := range m.suspended {
		if x == s {
			m.suspended = append(m.suspended[:i], m.suspended[i+1:]...)
			break
		}
	}
}

// armMoveTimerLocked sets the timer for the oldest suspended stream's
// deadline.
func (m *Mux) armMoveTimerLocked() {
	if len(m.suspended) == 0 && m.liveLocked() {
		return
	}
	wait := m.cfg.MoveTimeout
	if len(m.suspended) > 0 {
		wait = time.Until(m.suspended[0].suspendedAt.Add(m.cfg.MoveTimeout))
	}
	armTimer(&m.moveTimer, wait, m.moveDeadline)
}

// peerLeftDeadline ends the group as its peer's close if no link came
// back within PeerLeftWait.
func (m *Mux) peerLeftDeadline() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err == nil && !m.liveLocked() {
		m.endLocked(errPeerLeft)
	}
}

// moveDeadline ends the streams that waited MoveTimeout for a link, and
// the group if it has none.
func (m *Mux) moveDeadline() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return
	}
	now := time.Now()
	for len(m.suspended) > 0 {
		s := m.suspended[0]
		waited := now.Sub(s.suspendedAt)
		if waited < m.cfg.MoveTimeout {
			break
		}
		s.moveFailedLocked(&MoveError{Cause: s.cause, Waited: waited})
	}
	if !m.liveLocked() && len(m.suspended) == 0 {
		m.endLocked(fmt.Errorf("%w: no link in %v after %w", ErrDown, m.cfg.MoveTimeout, m.lastDown))
		return
	}
	m.armMoveTimerLocked()
}

// Lost is the stream's engine finding its link dead (its keepalive saw no
// progress): the link has failed for every stream on it, which move
// (link.Resumer). It reports whether the group moves the stream.
func (s *Stream) Lost(cause error) bool {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.MoveTimeout <= 0 || s.l == nil || s.staleLocked() || m.err != nil {
		return false
	}
	s.l.downLocked(cause)
	return true
}
