package rdmanet

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/rdmanet/sdk/cm"
	"github.com/rdmanet/sdk/fallback"
	"github.com/rdmanet/sdk/internal/link"
	"github.com/rdmanet/sdk/internal/session"
)

// Resumable sessions (wire.FeatureResume, docs/protocol.md). Between two
// rdmanet peers a connection is a session that outlives the link it runs
// on: its link is internal/session's Link, which switches between paths
// (RDMA, then TCP) under the engine, and tells it of a new path or of the
// session's end through completions (poller.go's handleLocked). This file
// is rdmanet's side of it: the session's configuration, its errors and
// state for the API, and the paths.

// becomeSession makes c a resumable session over the link it has, its
// first path: c.link becomes the session's; c is not shared yet.
func (c *Conn) becomeSession(sc session.Config) {
	sc.Timeout = c.cfg.ResumeTimeout
	sc.PeerLeftWait = peerLeftWait(c.cfg)
	sc.FailbackInterval = c.cfg.FailbackInterval
	sc.PathName = linkPathName
	sc.NothingListens = nothingListens
	sc.GiveUp = func(e session.End) error {
		re := &ResumeError{Cause: e.Cause, Waited: e.Waited, Refused: e.Refused}
		for _, a := range e.Attempts {
			re.Attempts = append(re.Attempts, ResumeAttempt(a))
		}
		return re
	}
	sc.Moved = func(m session.Move) { countMove(sessionMoveOf(m)) }
	c.sess = session.New(c.link, sc)
	c.link = c.sess
}

func sessionMoveOf(m session.Move) SessionMove {
	return SessionMove{Reason: session.MoveReason(m.Cause), From: fallback.Transport(m.From), To: fallback.Transport(m.To)}
}

// onTCPLocked reports whether the connection runs over TCP now (a session
// that failed over to it); c.mu is held.
func (c *Conn) onTCPLocked() bool {
	return transportOfLink(c.link) == fallback.TCP
}

// ResumeError ends a session that could not resume within
// Config.ResumeTimeout, or that the server refused to resume: what broke
// the link, and each path tried, with why it failed.
type ResumeError struct {
	Cause    error // what broke the link
	Attempts []ResumeAttempt
	Waited   time.Duration
	Refused  bool // the server refused the session (unknown, stale, closed)
}

// ResumeAttempt is what became of the tries to resume a session on one
// path: how many, and the last one's error.
type ResumeAttempt struct {
	Path  string
	Tries int
	Err   error
}

func (e *ResumeError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rdmanet: the session could not resume in %v after %v", e.Waited.Round(time.Millisecond), e.Cause)
	if e.Refused {
		b.WriteString(" (the server refused it)")
	}
	for i, a := range e.Attempts {
		if i == 0 {
			b.WriteString("; tried:")
		}
		fmt.Fprintf(&b, " %s (%d times): %v;", a.Path, a.Tries, a.Err)
	}
	return strings.TrimSuffix(b.String(), ";")
}

func (e *ResumeError) Unwrap() error { return e.Cause }

// Timeout reports whether the session ran out of time (not refused).
func (e *ResumeError) Timeout() bool { return !e.Refused }

// ErrSessionRefused is matched by the error of a resume the server
// refused: the session is unknown to it (it restarted, or the session
// ended), the generation is stale (a replay, or a resume that another
// already won), or a resume of it is already under way.
var ErrSessionRefused = session.ErrRefused

// errResumeBusy answers a resume while another of the same session is
// under way: the dialer tries again (it is not a refusal).
var errResumeBusy = session.ErrBusy

// refusalReason is what a server tells a dialer of why it refused a
// resume: err's text without ErrSessionRefused's, which the dialer's error
// wraps again.
func refusalReason(err error) string {
	return strings.TrimPrefix(err.Error(), ErrSessionRefused.Error()+": ")
}

// peerLeftWait is how long the server waits for a dialer that left its
// link without closing to ask for a resume: it does at once, and a dead
// path on its way costs it resumeAnswerWait before it tries the next.
func peerLeftWait(cfg Config) time.Duration { return resumeAnswerWait + cfg.KeepAlive }

// nothingListens reports whether a resume's dial found nothing listening
// at the server's address and port (RDMA's reject by the host, or TCP's
// refusal): the server's listener is gone, and with it the session.
func nothingListens(err error) bool {
	var ee *cm.EventError
	return errors.As(err, &ee) && ee.NoListener() || errors.Is(err, syscall.ECONNREFUSED)
}

// linkPathName names the path a link runs on, for SessionState.Path and
// logs, the same way for the first link and the next ones: RDMA links by
// their addresses and device, TCP links by their addresses; others (the
// tests' pipes) by name.
func linkPathName(l link.Link, name string) string {
	switch transportOfLink(l) {
	case fallback.RDMA:
		return rdmaPathName(l)
	case fallback.TCP:
		return l.Caps().Name
	}
	return name
}

// SessionState describes a resumable session (Config.ResumeTimeout).
type SessionState struct {
	// Resumable: the connection is a session (both sides agreed).
	Resumable bool
	// ID is the first bytes of the session's id, enough to find it in
	// logs (the whole id is what a resume presents, and is not shown).
	ID string
	// Generation counts the resumes the server has confirmed.
	Generation uint32
	// Failovers is how many times this side moved the session to a new link.
	Failovers int
	// Path is the link the session runs on now ("" while it has none).
	Path string
	// Failbacks is how many times the dialer moved the session back to
	// its first path after it recovered, or from TCP to another RDMA path.
	Failbacks int
	// Suspended: the session lost its link and is resuming.
	Suspended bool
	// LastMove is the session's latest move to a new link, a failover or
	// a failback (At is zero before the first).
	LastMove SessionMoveEvent
}

// SessionMoveEvent is one move of a session to a new link.
type SessionMoveEvent struct {
	SessionMove
	// The paths, as in SessionState.Path.
	FromPath, ToPath string
	// At is when the new link took over.
	At time.Time
	// Pause is how long the session had no link: from when this side
	// found the old link broken (for a dead path, a keepalive interval or
	// more after it broke) to At. A failback makes its new link before it
	// lets go of the old, so its pause is short.
	Pause time.Duration
}

// Session reports the connection's session, if it is one.
func (c *Conn) Session() SessionState {
	if c.sess == nil {
		return SessionState{}
	}
	s := c.sess.Snapshot()
	st := SessionState{Resumable: true, ID: s.ID.String(), Generation: s.Generation, Failovers: s.Failovers,
		Path: s.Path, Failbacks: s.Failbacks, Suspended: s.Suspended}
	if m := s.LastMove; !m.At.IsZero() {
		st.LastMove = SessionMoveEvent{SessionMove: sessionMoveOf(m), FromPath: m.FromPath, ToPath: m.ToPath, At: m.At, Pause: m.Pause}
	}
	return st
}
