package group

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/wire"
)

// Moves off a link that works (StreamMove with wire.MoveRebalance): when
// the dialer of the group adds a link (a path that healed, or one that
// joined after the first streams opened), it moves streams from the links
// with the most onto it, until the links carry as many each, as a bond
// moves traffic back to a port that came up.
//
// A stream that leaves a link that works first lets its requests there
// complete: its engine is suspended (a Failed that matches link.ErrDown,
// as for a link that failed), what it queued and the link did not post is
// dropped (its engine sends it again after Resume), and only once the
// last request it posted has completed, so that nothing of it can land
// in the peer's ring later, does StreamMove go on the new link. The peer
// does the same before it answers. What arrives for the stream on the old
// link meanwhile is dropped: it landed, and the engines' Resume sends it
// again, to the same place.

// errRebalance suspends a stream that moves off a link that works.
var errRebalance = errors.New("group: the stream moves to a link with fewer streams")

// rebalanceLocked moves streams onto to, just added: every stream of a
// TCP link, then, unless the others stand by (SpreadFirstLink), from the
// links with the most until they even out (balanceLocked).
func (m *Mux) rebalanceLocked(to *baseLink) {
	if to.lastResort {
		return
	}
	for _, l := range m.links {
		if !l.lastResort || l.err != nil {
			continue
		}
		// Moves wait for to's receives, as any do (receivesFreedLocked).
		for s := m.leaverLocked(l); s != nil; s = m.leaverLocked(l) {
			s.leaveLocked(to, nil)
		}
	}
	m.retireLastResortLocked()
	m.balanceLocked()
}

// balanceLocked, at the Mover, evens out what the links carry, a stream at
// a time from the link bound to carry the most onto the one bound to carry
// the least, until they are within one: when a link is added
// (rebalanceLocked), and again each time a move is answered. Streams on
// their way to a link count as its own, but may not leave it yet: a link
// added while the streams were still on their way to another (after the
// group's detour to TCP, its two paths back one after the other; the
// bench's group ended 64 and 36) takes its share once they have arrived.
func (m *Mux) balanceLocked() {
	if !m.cfg.Mover || m.cfg.MoveTimeout <= 0 || m.cfg.Spread == SpreadFirstLink || m.err != nil {
		return // with SpreadFirstLink the other links stand by
	}
	for {
		var least *baseLink
		for _, l := range m.links {
			if l.err == nil && !l.lastResort && (least == nil || l.bound() < least.bound()) {
				least = l
			}
		}
		if least == nil || !least.roomToMoveLocked() {
			return
		}
		// From the most loaded link that has a stream free to leave.
		var from *baseLink
		var s *Stream
		for _, l := range m.links {
			if l.err != nil || l.lastResort || l.bound() <= least.bound()+1 || (from != nil && l.bound() <= from.bound()) {
				continue
			}
			if leaver := m.leaverLocked(l); leaver != nil {
				from, s = l, leaver
			}
		}
		if s == nil {
			return
		}
		s.leaveLocked(least, nil)
	}
}

// bound is how many streams l will carry: those on it that stay, and those
// on their way to it.
func (l *baseLink) bound() int { return l.staying() + l.arriving }

// errRetired ends a TCP link that no stream is on once another link
// works: streams move to it only when none does (not a failure).
var errRetired = disconnected{fmt.Errorf("%w: the TCP link carries no stream while another link works: retired", ErrDown)}

// retireLastResortLocked ends, at the group's dialer, each TCP link that
// no stream is on or on its way to, once another link works and no move
// waits for its answer (the peer's streams left the TCP link before it
// answered): the peer sees it disconnected with nothing on it.
func (m *Mux) retireLastResortLocked() {
	if !m.cfg.Mover || m.err != nil || m.onlyLastResortLocked() || !m.liveLocked() {
		return
	}
	for _, s := range m.slots {
		if s != nil && s.moving {
			return
		}
	}
	for _, l := range slices.Clone(m.links) {
		if l.lastResort && l.err == nil && l.streams == 0 && l.arriving == 0 {
			l.downLocked(errRetired)
		}
	}
}

// staying is how many of l's streams are not leaving it.
func (l *baseLink) staying() int { return l.streams - l.leaving }

// leaverLocked is a stream on l that may leave it: open, and not closing,
// moving or leaving already.
func (m *Mux) leaverLocked(l *baseLink) *Stream {
	for _, s := range m.slots {
		if s != nil && s.l == l && s.state == open && !s.leaving && !s.moving && !s.disconnecting && !s.down &&
			!s.peerClosed && !s.closeSent && s.announced {
			return s
		}
	}
	return nil
}

// leaveLocked starts the stream's move off its link, which works, to
// to: at the dialer, it sends StreamMove once it left; at its peer, ask
// is the StreamMove to answer then.
func (s *Stream) leaveLocked(to *baseLink, ask *wire.GroupMessage) {
	from := s.l
	s.leaving, s.leaveTo, s.leaveAsk = true, to, ask
	from.leaving++
	to.arriving++
	s.dropQueuedLocked()
	if !s.lostLocked() {
		s.fails++
		s.pushLocked(link.Completion{Kind: link.Failed, Err: movingError(from, errRebalance)}, 0)
		s.signalLocked()
	}
	if s.inflight == 0 {
		s.leftLocked()
		return
	}
	// A link that does not complete what was posted on it within the move
	// timeout has failed: its streams move as for any failure.
	m := s.m
	s.leaveTimer = time.AfterFunc(m.cfg.MoveTimeout, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if s.leaving && s.l == from {
			from.downLocked(fmt.Errorf("%w: %s completed nothing in %v", ErrDown, from.name(), m.cfg.MoveTimeout))
		}
	})
}

// leftLocked: the last request the leaving stream posted on its link
// completed. It takes the stream off the link, and moves it.
func (s *Stream) leftLocked() {
	m := s.m
	to, ask := s.endLeaveLocked()
	s.detachLocked() // the link works on: its receives go back to its pool
	s.announced = false
	s.peerRings, s.nextRing = [3]remoteRing{}, 0
	if s.settledLocked() {
		// Closed at both ends while it left: nothing to move.
		if ask != nil {
			movedRefusal(to, *ask, wire.ReasonGone)
		}
		m.maybeFreeLocked(s)
		return
	}
	s.suspendedAt, s.cause = time.Now(), errRebalance
	s.waiting = true
	m.suspended = append(m.suspended, s)
	switch {
	case ask != nil:
		// The peer of the dialer answers the move it was asked for.
		to.takeOrQueueMoveLocked(*ask)
	case to.err == nil && to.roomToMoveLocked():
		m.dropSuspendedLocked(s)
		m.moveLocked(s, to, wire.MoveRebalance)
	default:
		m.moveSuspendedLocked() // to failed or filled meanwhile: another
	}
	m.armMoveTimerLocked()
}

// rebalanceAskedLocked takes the dialer's StreamMove of a stream off its
// link, which works here too: the stream leaves it, then the move is
// answered.
func (m *Mux) rebalanceAskedLocked(l *baseLink, s *Stream, g wire.GroupMessage) {
	if s.leaving {
		m.protocolLocked(l, fmt.Errorf("StreamMove of %#x, which moves already", uint32(s.tag)))
		return
	}
	s.leaveLocked(l, &g)
}

// stopLeavingLocked: the link a leaving stream was on failed first; the
// stream is suspended as the others, and a move it was asked for is
// answered as theirs are.
func (s *Stream) stopLeavingLocked() {
	if !s.leaving {
		return
	}
	if to, ask := s.endLeaveLocked(); ask != nil {
		to.movesWaiting = append([]wire.GroupMessage{*ask}, to.movesWaiting...)
	}
}

// endLeaveLocked ends the stream's leaving of its link (it left, or the
// link failed first) and returns where it was going and the move it was
// asked for, if any.
func (s *Stream) endLeaveLocked() (to *baseLink, ask *wire.GroupMessage) {
	if s.leaveTimer != nil {
		s.leaveTimer.Stop()
		s.leaveTimer = nil
	}
	to, ask = s.leaveTo, s.leaveAsk
	s.leaving, s.leaveTo, s.leaveAsk = false, nil, nil
	s.l.leaving--
	to.arriving--
	return to, ask
}
